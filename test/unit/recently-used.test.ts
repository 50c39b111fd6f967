import { expect } from 'chai';
import { RecentlyUsed } from '../../infrastructure/concurrency/recently-used';

/** A map on a clock the test moves (`at`), with the keys it dropped. */
function watched(idleMs: number) {
  const clock = { now: 0 };
  const dropped: string[] = [];
  const m = new RecentlyUsed<number>({ idleMs, now: () => clock.now, onDrop: (_, k) => dropped.push(k) });
  return { m, dropped, at: (ms: number) => (clock.now = ms) };
}

describe('RecentlyUsed: per-key state kept while used', () => {
  it('drops entries unused for idleMs as new keys come, and keeps those used since', () => {
    const { m, dropped, at } = watched(100);
    m.set('a', 1);
    m.set('b', 2);
    at(50);
    expect(m.get('a')).to.equal(1); // a used at 50, b last at 0
    at(120);
    m.set('c', 3);
    expect(dropped).to.deep.equal(['b']);
    expect(m.peek('a')).to.equal(1);
    expect(m.peek('b')).to.equal(undefined);
    expect(m.size).to.equal(2);
  });

  it('holds about the keys used within idleMs under endless churn, not every key ever added', () => {
    let now = 0;
    const m = new RecentlyUsed<number>({ idleMs: 1_000, now: () => now });
    const most = [0, 0];
    for (let i = 0; i < 100_000; i++) {
      now += 1; // a new key every ms: 1,000 used within idleMs
      m.set(`k${i}`, i);
      most[i < 50_000 ? 0 : 1] = Math.max(most[i < 50_000 ? 0 : 1], m.size);
    }
    // Kept entries moved to the back leave some idle ones behind them for a while: a bounded excess.
    expect(most[0]).to.be.within(1_000, 1_500);
    expect(most[1], 'no growth over time').to.be.at.most(most[0]);
  });

  it('keeps an idle entry its owner still needs, and drops it once it may go', () => {
    let now = 0;
    const busy = new Set(['held']);
    const m = new RecentlyUsed<string>({ idleMs: 10, now: () => now, canDrop: (_, k) => !busy.has(k) });
    m.set('held', 'x');
    for (let i = 0; i < 100; i++) {
      now += 100;
      m.set(`k${i}`, 'y');
    }
    expect(m.peek('held')).to.equal('x');
    expect(m.size).to.be.at.most(4);
    busy.clear();
    for (let i = 0; i < 4; i++) {
      now += 100;
      m.set(`later${i}`, 'y');
    }
    expect(m.peek('held')).to.equal(undefined);
  });

  it('set on a kept key replaces its value without dropping anything; delete is not a drop', () => {
    const { m, dropped, at } = watched(10);
    m.set('a', 1);
    m.set('b', 1);
    at(100);
    m.set('a', 2);
    expect(dropped).to.deep.equal([]);
    expect([...m.values()]).to.deep.equal([2, 1]);
    expect(m.delete('b')).to.equal(true);
    expect(dropped).to.deep.equal([]);
  });
});
