// The spend metric stays a bounded set of series however many workspaces a process bills.
import { expect } from 'chai';
import { Metrics, SPEND_SERIES } from '../../infrastructure/metrics';

const ws = (i: number) => `ws_${String(i).padStart(6, '0')}`;

async function spendSeries(m: Metrics): Promise<Map<string, number>> {
  const series = new Map<string, number>();
  for (const line of (await m.text()).split('\n')) {
    const match = /^gateway_spend_usd_total\{workspace="([^"]+)"\} (\S+)$/.exec(line);
    if (match) series.set(match[1], Number(match[2]));
  }
  return series;
}

describe('spend metric', () => {
  it(`labels the first ${SPEND_SERIES} workspaces billed, counts the rest as "other", and keeps every sum exact`, async () => {
    const m = new Metrics();
    const workspaces = SPEND_SERIES * 20;
    for (let i = 0; i < workspaces; i++) m.billed(ws(i), 0.5);
    // A labelled workspace billed again keeps its own series; one past the bound stays in "other".
    m.billed(ws(0), 0.25);
    m.billed(ws(SPEND_SERIES), 0.25);

    const series = await spendSeries(m);
    expect(series.size).to.equal(SPEND_SERIES + 1);
    expect(series.get(ws(0))).to.equal(0.75);
    expect(series.get(ws(SPEND_SERIES - 1))).to.equal(0.5);
    expect(series.has(ws(SPEND_SERIES))).to.equal(false);
    expect(series.get('other')).to.equal((workspaces - SPEND_SERIES) * 0.5 + 0.25);
    expect([...series.values()].reduce((a, b) => a + b, 0)).to.equal(workspaces * 0.5 + 0.5);
  });
});
