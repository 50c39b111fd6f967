// Reads by id gathered into reads of a set: waiters share a read, a failed read fails only its own.
import { expect } from 'chai';
import { Gathered } from '../../infrastructure/concurrency/gathered';

describe('gathered reads', () => {
  it('asks once for an id asked twice, and a failed read fails only the ids it held', async () => {
    const asked: string[][] = [];
    let fail = true;
    const g = new Gathered<string>(async (ids) => {
      asked.push(ids);
      if (fail) {
        fail = false;
        throw new Error('database away');
      }
      return new Map(ids.filter((id) => id !== 'missing').map((id) => [id, id.toUpperCase()]));
    });
    const first = Promise.allSettled([g.get('a'), g.get('a')]);
    await new Promise((r) => setImmediate(r));
    const b = g.get('b'); // asked while the first read is in flight
    const missing = g.get('missing');
    const results = [...(await first), ...(await Promise.allSettled([b, missing]))];
    expect(results.map((r) => r.status)).to.deep.equal(['rejected', 'rejected', 'fulfilled', 'fulfilled']);
    expect((results[0] as PromiseRejectedResult).reason.message).to.equal('database away');
    expect(await b).to.equal('B');
    expect(await missing).to.equal(undefined);
    expect(asked).to.deep.equal([['a'], ['b', 'missing']]);
  });
});
