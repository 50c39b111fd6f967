// The rate limiter's per-key state: keys of past windows are dropped, and the walk that finds them
// is spread over the map's growth (not made at every new key once 10,000 are current).
import { expect } from 'chai';
import { RateLimiter } from '../../domain/accounts/rate-limit';
import type { Store } from '../../infrastructure/store';

describe('rate limiter: keys held per process', () => {
  // Only claims reach the store, and none is made here: each key's state is created, not used.
  const limiter = new RateLimiter({} as Store, 600, 60, () => 0);
  let walks = 0;
  const drop = limiter['dropStale'].bind(limiter);
  limiter['dropStale'] = (window: number) => {
    walks++;
    drop(window);
  };
  const seen = (keys: number, window: number, prefix: string) => {
    for (let i = 0; i < keys; i++) limiter['current'](`${prefix}${i}`, window);
  };

  it('30,000 keys current in one window: two walks of the map, not one per key past 10,000', () => {
    seen(30_000, 1, 'a');
    expect(limiter['keys'].size).to.equal(30_000);
    expect(walks).to.equal(2); // at 10,000 and 20,000 keys, each finding none stale
  });

  it("the next window's keys drop the last window's, and the map stays within twice the current keys", () => {
    walks = 0;
    let most = 0;
    for (let i = 0; i < 30_000; i++) {
      limiter['current'](`b${i}`, 2);
      most = Math.max(most, limiter['keys'].size);
    }
    expect(walks).to.be.at.most(3);
    expect(most).to.be.at.most(40_000);
    expect(limiter['keys'].has('a0')).to.equal(false);
    expect([...limiter['keys'].values()].every((k) => k.window === 2)).to.equal(true);
  });
});
