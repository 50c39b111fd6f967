// The provider limiter's semaphore: a freed slot passes to the waiting owner (workspace) holding the
// fewest, and capped slots stay within the owner's share, so what one owner leaves stays the others'.
import { expect } from 'chai';
import { ownerShare, Semaphore } from '../../infrastructure/concurrency/semaphore';

/** A pending acquire whose outcome can be looked at without awaiting it. */
function pending(p: Promise<() => void>) {
  const state: { release: (() => void) | null; error: Error | null } = { release: null, error: null };
  p.then(
    (r) => (state.release = r),
    (e: Error) => (state.error = e),
  );
  return state;
}
const turn = () => new Promise((r) => setImmediate(r));

describe('semaphore shares', () => {
  it('leaves a quarter of the slots to other owners (none for a limit below 4)', () => {
    expect([1, 3, 4, 8, 20, 100].map(ownerShare)).to.deep.equal([1, 3, 3, 6, 15, 75]);
  });

  it('an owner at its share waits while another takes the slot left; a freed slot skips the capped owner’s waiter', async () => {
    const s = new Semaphore(4, 3);
    const a = await Promise.all([
      s.acquire({ owner: 'a', capped: true }),
      s.acquire({ owner: 'a', capped: true }),
      s.acquire({ owner: 'a', capped: true }),
    ]);
    const aFourth = pending(s.acquire({ owner: 'a', capped: true }));
    await turn();
    expect(aFourth.release, 'a holds its share of 3').to.equal(null);
    const b = await s.acquire({ owner: 'b', capped: true }); // the slot a may not take
    const c = pending(s.acquire({ owner: 'c', capped: true })); // all 4 held: c waits behind a's waiter
    await turn();
    expect(c.release).to.equal(null);
    b();
    await turn();
    expect(c.release, "b's slot goes to c, the first waiter that may take it").to.be.a('function');
    expect(aFourth.release).to.equal(null);
    a[0]();
    await turn();
    expect(aFourth.release, "a's own freed slot goes to a's waiter").to.be.a('function');
    // Everything given back: all four slots are free again, for anyone.
    for (const r of [a[1], a[2], aFourth.release!, c.release!]) r();
    const all = await Promise.all(['x', 'x', 'x', 'y'].map((owner) => s.acquire({ owner })));
    expect(all).to.have.length(4);
  });

  it('says whether a wait ran out on the owner’s share or on the whole limit', async () => {
    const s = new Semaphore(4, 3);
    await Promise.all([1, 2, 3].map(() => s.acquire({ owner: 'a', capped: true })));
    const capped = s.acquire({ owner: 'a', capped: true, waitMs: 10, onTimeout: (c) => new Error(c ? 'share' : 'limit') });
    await s.acquire({ owner: 'b', capped: true });
    const full = s.acquire({ owner: 'b', capped: true, waitMs: 10, onTimeout: (c) => new Error(c ? 'share' : 'limit') });
    expect(await capped.catch((e: Error) => e.message)).to.equal('share');
    expect(await full.catch((e: Error) => e.message)).to.equal('limit');
  });

  it('lets uncapped slots use the whole limit, and gives a freed slot to the waiting owner holding the fewest', async () => {
    const s = new Semaphore(4, 3);
    const a = await Promise.all([1, 2, 3, 4].map(() => s.acquire({ owner: 'a' }))); // calls that end by themselves: all four
    const aMore = pending(s.acquire({ owner: 'a' })); // a's queue first...
    const b = pending(s.acquire({ owner: 'b' })); // ...then b, which holds none
    await turn();
    a[0]();
    await turn();
    expect(b.release, 'the freed slot goes to b, holding none, before a, holding three').to.be.a('function');
    expect(aMore.release).to.equal(null);
    a[1]();
    await turn();
    expect(aMore.release).to.be.a('function');
    // A capped slot is not taken past the share even when slots are free.
    for (const r of [a[2], a[3], aMore.release!]) r();
    await Promise.all([1, 2, 3].map(() => s.acquire({ owner: 'c', capped: true })));
    const fourth = pending(s.acquire({ owner: 'c', capped: true }));
    await turn();
    expect(fourth.release, 'one slot free, but c holds its share').to.equal(null);
  });

  it('counts unowned slots only against the limit', async () => {
    const s = new Semaphore(4, 1);
    const held = await Promise.all([1, 2, 3, 4].map(() => s.acquire()));
    expect(held).to.have.length(4);
    const fifth = pending(s.acquire());
    await turn();
    expect(fifth.release).to.equal(null);
    held[0]();
    await turn();
    expect(fifth.release).to.be.a('function');
  });
});
