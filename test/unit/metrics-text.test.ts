// The scrape text is made afresh at most ten times a second: /metrics may be open to anyone.
import { expect } from 'chai';
import { Metrics } from '../../infrastructure/metrics';

describe('metrics text', () => {
  it('shares a text being made, makes at most 10 a second, and past that serves the last one again', async () => {
    const m = new Metrics();
    const registry = (m as unknown as { registry: { metrics: () => Promise<string> } }).registry;
    const metrics = registry.metrics.bind(registry);
    let made = 0;
    registry.metrics = () => (made++, metrics());
    const created = async () => Number(/^gateway_batches_created_total (\S+)$/m.exec(await m.text())?.[1]);

    // Scrapes arriving together share one text.
    const together = await Promise.all(Array.from({ length: 30 }, () => m.text()));
    expect(made).to.equal(1);
    expect(new Set(together).size).to.equal(1);

    // One after another, each after a change: fresh until 10 were made within the second …
    const seen: number[] = [];
    for (let i = 0; i < 12; i++) {
      m.batchesCreated.inc();
      seen.push(await created());
    }
    expect(made).to.equal(10);
    expect(seen).to.deep.equal([1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9, 9]);
    // … and fresh again once the second is over.
    await new Promise((r) => setTimeout(r, 1_000));
    expect(await created()).to.equal(12);
  });
});
