// Per-key rate limits shared by every API process through MongoDB. Each admitted request inserts a
// numbered ticket for its window (`key:window:n`); a unique `_id` insert is atomic even on FerretDB,
// whose read-modify-write updates are not, so no two processes can admit the same ticket and the
// count is exact. Processes remember where they got to, so the usual cost is one insert.
import { isDuplicateKey, type Store } from '../store';

export interface RateDecision {
  allowed: boolean;
  limit: number;
  remaining: number;
  /** Unix seconds at which the current window ends. */
  resetAt: number;
  retryAfterSeconds: number;
}

export class RateLimiter {
  private readonly next = new Map<string, { window: number; n: number }>();

  constructor(
    private readonly store: Store,
    readonly limit: number,
    readonly windowSeconds: number,
    private readonly now: () => number = Date.now,
  ) {}

  async take(keyId: string): Promise<RateDecision> {
    const nowMs = this.now();
    const window = Math.floor(nowMs / (this.windowSeconds * 1000));
    const resetAt = (window + 1) * this.windowSeconds;
    const hint = this.next.get(keyId);
    if (hint?.window !== window) void this.forgetOldWindows(keyId, window);
    let n = hint?.window === window ? hint.n : 1;
    let counted = false;
    while (n <= this.limit) {
      try {
        await this.store.rateTickets.insertOne({ _id: `${keyId}:${window}:${n}`, key_id: keyId, window });
        this.next.set(keyId, { window, n: n + 1 });
        return { allowed: true, limit: this.limit, remaining: this.limit - n, resetAt, retryAfterSeconds: 0 };
      } catch (err) {
        if (!isDuplicateKey(err)) throw err;
        // Another process admitted that ticket. Jump to the window's count once, then step.
        if (!counted) {
          counted = true;
          n = Math.max(n + 1, (await this.store.rateTickets.countDocuments({ key_id: keyId, window })) + 1);
        } else {
          n++;
        }
      }
    }
    this.next.set(keyId, { window, n });
    return { allowed: false, limit: this.limit, remaining: 0, resetAt, retryAfterSeconds: Math.max(1, Math.ceil(resetAt - nowMs / 1000)) };
  }

  private async forgetOldWindows(keyId: string, window: number): Promise<void> {
    await this.store.rateTickets.deleteMany({ key_id: keyId, window: { $lt: window } }).catch(() => undefined);
  }
}
