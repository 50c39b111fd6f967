// Per-key rate limits shared by every API process through MongoDB, with no contention on the hot
// path. A window's `limit` tickets are cut into fixed blocks; a process claims a whole block with
// one insert of the block's `_id` (`key:window:b<n>`) and hands its tickets out locally. A unique
// `_id` insert is atomic even on FerretDB, so no two processes ever hold the same block and the
// processes together never admit more than the limit. Within a process one claim per key is in
// flight at a time and concurrent requests wait for it, so they never race for the same ticket.
//
// The price of blocks: a process that stops receiving requests for a key may leave up to
// `blockSize − 1` tickets of its last block unused until the window ends. Under load on every
// process (the case a limit is for) every ticket is used and admission is exact.
import type { AnyBulkWriteOperation } from 'mongodb';
import { isDuplicateKey, type RateTicketDoc, type Store } from '../store';

export interface RateDecision {
  allowed: boolean;
  limit: number;
  remaining: number;
  /** Unix seconds at which the current window ends. */
  resetAt: number;
  retryAfterSeconds: number;
}

/** Tickets per block: one for small limits (exact even across idle processes), up to 64 for large ones. */
export function blockSizeFor(limit: number): number {
  return Math.max(1, Math.min(64, Math.floor(limit / 64)));
}

interface KeyWindow {
  window: number;
  /** The next local ticket (1-based across the window) and the end of the held block (exclusive). */
  next: number;
  end: number;
  /** The next block this process will try to claim; blocks below it are taken. */
  block: number;
  exhausted: boolean;
  claiming: Promise<void> | null;
  /** Blocks this process holds in this window, deleted by `_id` once the window is over. */
  claimed: string[];
}

export class RateLimiter {
  readonly blockSize: number;
  private readonly blocks: number;
  private readonly keys = new Map<string, KeyWindow>();

  constructor(
    private readonly store: Store,
    readonly limit: number,
    readonly windowSeconds: number,
    private readonly now: () => number = Date.now,
  ) {
    this.blockSize = blockSizeFor(limit);
    this.blocks = Math.ceil(limit / this.blockSize);
  }

  async take(keyId: string): Promise<RateDecision> {
    const nowMs = this.now();
    const window = Math.floor(nowMs / (this.windowSeconds * 1000));
    const resetAt = (window + 1) * this.windowSeconds;
    const s = this.current(keyId, window);
    for (;;) {
      if (s.next < s.end) {
        const n = s.next++;
        return { allowed: true, limit: this.limit, remaining: this.limit - n, resetAt, retryAfterSeconds: 0 };
      }
      if (s.exhausted) {
        return { allowed: false, limit: this.limit, remaining: 0, resetAt, retryAfterSeconds: Math.max(1, Math.ceil(resetAt - nowMs / 1000)) };
      }
      s.claiming ??= this.claim(keyId, s).finally(() => { s.claiming = null; });
      await s.claiming;
    }
  }

  /** This key's state for `window`, retiring the state of an older window. */
  private current(keyId: string, window: number): KeyWindow {
    const s = this.keys.get(keyId);
    if (s && s.window >= window) return s;
    if (s) this.retire([s]);
    // Keys that stopped sending keep their old window's entry until seen again; bound the map.
    if (this.keys.size >= 10_000) {
      const stale = [...this.keys].filter(([, k]) => k.window < window);
      for (const [k] of stale) this.keys.delete(k);
      this.retire(stale.map(([, k]) => k));
    }
    const fresh: KeyWindow = { window, next: 0, end: 0, block: 0, exhausted: false, claiming: null, claimed: [] };
    this.keys.set(keyId, fresh);
    return fresh;
  }

  /** Claims the next free block: one insert, plus one per block another process took first. */
  private async claim(keyId: string, s: KeyWindow): Promise<void> {
    while (s.block < this.blocks) {
      const b = s.block++;
      const _id = `${keyId}:${s.window}:b${b}`;
      try {
        await this.store.rateTickets.insertOne({ _id, key_id: keyId, window: s.window });
      } catch (err) {
        if (isDuplicateKey(err)) continue;
        s.block = b; // not taken: try it again next time
        throw err;
      }
      s.claimed.push(_id);
      s.next = b * this.blockSize + 1;
      s.end = Math.min(this.limit, (b + 1) * this.blockSize) + 1;
      return;
    }
    s.exhausted = true;
  }

  /** Deletes finished windows' blocks by `_id` (no scan), in the background: they only take space. */
  private retire(windows: KeyWindow[]): void {
    const ops: AnyBulkWriteOperation<RateTicketDoc>[] = windows.flatMap((w) => w.claimed.map((_id) => ({ deleteOne: { filter: { _id } } })));
    if (ops.length) this.store.rateTickets.bulkWrite(ops, { ordered: false }).catch(() => undefined);
  }
}
