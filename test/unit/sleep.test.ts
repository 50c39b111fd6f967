// A batch chunk's lines share one abort signal for the chunk's whole life: every wait on it must
// take its listener away when it is over, or listeners pile up (Node warned at 81 on a 300-line batch).
import { expect } from 'chai';
import { getEventListeners, setMaxListeners } from 'node:events';
import { sleep } from '../../infrastructure/concurrency/sleep';

describe('sleep', () => {
  it('leaves no listener on the signal once it is over, and ends at once on abort', async () => {
    const controller = new AbortController();
    setMaxListeners(1_000, controller.signal); // 1,000 waits at once here, as a chunk's lines do (activities/batches)
    await Promise.all(Array.from({ length: 1_000 }, () => sleep(1, controller.signal)));
    expect(getEventListeners(controller.signal, 'abort')).to.have.length(0);
    const started = Date.now();
    const long = sleep(60_000, controller.signal);
    controller.abort();
    await long;
    expect(Date.now() - started).to.be.below(1_000);
    expect(getEventListeners(controller.signal, 'abort')).to.have.length(0);
  });
});
