// Per-key rate limits shared by every API process through MongoDB, with no contention on the hot
// path. A window's `limit` tickets are cut into fixed blocks; a process claims a whole block with
// one insert of the block's `_id` (`key:window:b<n>`) and hands its tickets out locally. A unique
// `_id` insert is atomic even on FerretDB, so no two processes ever hold the same block and the
// processes together never admit more than the limit. Within a process one claim per key is in
// flight at a time and concurrent requests wait for it, so they never race for the same ticket;
// the next claim starts while half of the held tickets are left, so under steady load requests do
// not wait on the database at all, and a process that keeps running dry, or claims again within
// QUICK_CLAIM_MS, claims more blocks per write (each claim is an insert, ~1 ms of FerretDB's CPU).
//
// Through a database outage the limiter fails open: a request that would wait for a claim the
// database cannot answer (an unreachable-database error, or no answer within CLAIM_PATIENCE_MS) is
// admitted, and so are the next ones for a moment, without waiting; limits apply again once claims
// go through. A database whose disk is full answers, but takes no claim: the same, trying a claim
// once per CLAIM_PATIENCE_MS. A limit protects capacity; refusing every request while the database
// is away (or full) would take the gateway down with it.
//
// Claims skip what other processes took without trying it block by block. Every process numbers
// the blocks from the window's start, so a write that finds every block taken is followed by one
// at the next blocks, then by ones jumping twice as far each time: the writes that fail grow with
// the logarithm of how far the others are ahead. Three processes on one key (the proxy bench's
// layout) made 620-640 writes each for 190-270 blocks when every taken block was tried (a failed
// write of eight costs FerretDB 1.5 ms of CPU); jumping, 66-68. Blocks jumped over are tried once
// the window's last block is reached, so every block is used before a key is refused.
//
// Blocks live in a collection per day (per period of a window's length, for windows over a day).
// A process deletes its blocks by `_id` once their window is over; the first window of each new
// period a process sees drops the collections of the periods before the last, so the blocks of a
// process that stopped (or of a key it stopped seeing) are gone within two days, with no scan.
//
// The price of blocks: a process that stops receiving requests for a key may leave the tickets it
// still holds unused until the window ends: at most a claim and a half, about 1/40 of the limit,
// and none for limits under 128 (single-ticket blocks, never claimed ahead). Under load on every process (the case a limit is for) every ticket is used and
// admission is exact.
import type { AnyBulkWriteOperation, Collection } from 'mongodb';
import { insertManyEach, isDatabaseFull, type RateTicketDoc, type Store } from '../../infrastructure/store';

/** How long a request waits for a claim before the database counts as away and the request is admitted. */
const CLAIM_PATIENCE_MS = 1_000;
/** A key that needs another claim this soon after its last is busy: its claims grow (up to the cap). */
const QUICK_CLAIM_MS = 1_000;
/** Keys held before those of past windows are first dropped. */
const MIN_DROP_AT = 10_000;
const DAY_SECONDS = 86_400;

export interface RateDecision {
  allowed: boolean;
  limit: number;
  remaining: number;
  /** Unix seconds at which the current window ends. */
  resetAt: number;
  retryAfterSeconds: number;
  /** Admitted without a ticket: the database could not answer in time, so the limit failed open. */
  unchecked?: true;
}

/** Tickets per block: one for small limits (exact even across idle processes), up to 64 for large ones. */
export function blockSizeFor(limit: number): number {
  return Math.max(1, Math.min(64, Math.floor(limit / 64)));
}

interface KeyWindow {
  window: number;
  /** Ticket ranges held here, oldest first: [next, end) with tickets numbered from 1 across the window. */
  ranges: [number, number][];
  held: number;
  /** The next block this process will try to claim; blocks below it are taken, or in `skipped`. */
  block: number;
  /** Runs of blocks [first, end) jumped over by claims that found others ahead, tried once `block` reaches the end. */
  skipped: [number, number][];
  /** Blocks claimed per write; doubles (up to a cap) when a request had to wait, or claims come quickly. */
  perClaim: number;
  /** When the last claim started (the limiter's clock). */
  lastClaimAt: number;
  exhausted: boolean;
  claiming: Promise<void> | null;
  /** Blocks this process holds in this window, deleted by `_id` once the window is over. */
  claimed: string[];
}

export class RateLimiter {
  readonly blockSize: number;
  private readonly blocks: number;
  /** At most 1/64 of the limit is claimed per write (a block, until blocks reach their cap of 64). */
  private readonly maxPerClaim: number;
  private readonly keys = new Map<string, KeyWindow>();
  /** Writes made to claim blocks, for tests and the benchmark. */
  claimWrites = 0;
  /** The map's size at which keys of past windows are next dropped. */
  private dropAt = MIN_DROP_AT;
  /** Until then requests that need a claim are admitted without one: the database's disk was full. */
  private fullUntil = 0;
  /** Seconds per collection of blocks: a day, or whole days covering a window. */
  private readonly periodSeconds: number;
  /** The latest period a window was seen in, and its collection. */
  private period = -1;
  private tickets: Collection<RateTicketDoc> | null = null;
  /** The drop of older periods' collections that the latest period began (tests await it). */
  oldPeriodsDropped: Promise<unknown> = Promise.resolve();

  constructor(
    private readonly store: Store,
    readonly limit: number,
    readonly windowSeconds: number,
    private readonly now: () => number = Date.now,
  ) {
    this.blockSize = blockSizeFor(limit);
    this.blocks = Math.ceil(limit / this.blockSize);
    this.maxPerClaim = Math.max(1, Math.min(8, Math.floor(limit / (64 * this.blockSize))));
    this.periodSeconds = DAY_SECONDS * Math.ceil(windowSeconds / DAY_SECONDS);
  }

  /** The collection holding a window's blocks. */
  blocksOf(window: number): Collection<RateTicketDoc> {
    const period = Math.floor((window * this.windowSeconds) / this.periodSeconds);
    if (period === this.period && this.tickets) return this.tickets;
    if (period < this.period) return this.store.rateTickets(this.windowSeconds, period);
    // A new period: older collections than the last one hold only windows that are over. A
    // failed drop is tried again by the next period, or another process.
    this.period = period;
    this.tickets = this.store.rateTickets(this.windowSeconds, period);
    this.oldPeriodsDropped = this.store.dropRateTicketsBefore(this.windowSeconds, period - 1).catch(() => undefined);
    return this.tickets;
  }

  /**
   * Takes `weight` tickets of the key's window (a request: one). Refused once the window has fewer
   * left; the tickets taken by then stay spent.
   */
  async take(keyId: string, weight = 1): Promise<RateDecision> {
    const nowMs = this.now();
    const window = Math.floor(nowMs / (this.windowSeconds * 1000));
    const resetAt = (window + 1) * this.windowSeconds;
    const s = this.current(keyId, window);
    let waited = false;
    let needed = weight;
    for (;;) {
      let last = 0;
      while (needed > 0 && s.ranges.length) {
        const range = s.ranges[0];
        const n = Math.min(needed, range[1] - range[0]);
        range[0] += n;
        last = range[0] - 1;
        if (range[0] === range[1]) s.ranges.shift();
        s.held -= n;
        needed -= n;
      }
      if (needed <= 0) {
        // Claim ahead while half a claim's worth is left, so requests rarely wait on the database.
        // Not with single-ticket blocks (limits under 128): there every ticket held is one in use.
        if (this.blockSize > 1 && s.held < (s.perClaim * this.blockSize) / 2) void this.claimSoon(keyId, s);
        return { allowed: true, limit: this.limit, remaining: this.limit - last, resetAt, retryAfterSeconds: 0 };
      }
      if (s.exhausted) {
        return {
          allowed: false,
          limit: this.limit,
          remaining: 0,
          resetAt,
          retryAfterSeconds: Math.max(1, Math.ceil(resetAt - nowMs / 1000)),
        };
      }
      if (s.claiming && !waited && s.claimed.length) s.perClaim = Math.min(this.maxPerClaim, s.perClaim * 2);
      waited = true;
      if (this.store.away || nowMs < this.fullUntil || !(await this.claimPatiently(keyId, s))) {
        if (nowMs >= this.fullUntil) void this.claimSoon(keyId, s);
        return { allowed: true, limit: this.limit, remaining: 0, resetAt, retryAfterSeconds: 0, unchecked: true };
      }
    }
  }

  /** Whether a claim went through in time; false when the database is away or its disk is full (then for a moment). */
  private async claimPatiently(keyId: string, s: KeyWindow): Promise<boolean> {
    try {
      return (await this.store.patiently(this.claimSoon(keyId, s), CLAIM_PATIENCE_MS)) !== null;
    } catch (err) {
      if (!isDatabaseFull(err)) throw err;
      this.fullUntil = this.now() + CLAIM_PATIENCE_MS;
      return false;
    }
  }

  /** Resolves once no claim for the key is in flight (tests: claims ahead of need run in the background). */
  async claimsDone(keyId: string): Promise<void> {
    await this.keys.get(keyId)?.claiming?.catch(() => undefined);
  }

  /** The claim in flight for this key, or a new one. Its failure reaches whoever awaits it. */
  private claimSoon(keyId: string, s: KeyWindow): Promise<void> {
    if (!s.claiming && !s.exhausted) {
      s.claiming = this.claim(keyId, s).finally(() => {
        s.claiming = null;
      });
      s.claiming.catch(() => undefined); // a claim ahead of need has nobody waiting on it
    }
    return s.claiming ?? Promise.resolve();
  }

  /** This key's state for `window`, retiring the state of an older window. */
  private current(keyId: string, window: number): KeyWindow {
    const s = this.keys.get(keyId);
    if (s && s.window >= window) return s;
    if (s) this.retire([s]);
    if (this.keys.size >= this.dropAt) this.dropStale(window);
    const fresh: KeyWindow = {
      window,
      ranges: [],
      held: 0,
      block: 0,
      skipped: [],
      perClaim: 1,
      lastClaimAt: 0,
      exhausted: false,
      claiming: null,
      claimed: [],
    };
    this.keys.set(keyId, fresh);
    return fresh;
  }

  /**
   * Claims the next free blocks, `perClaim` at a time, in one unordered insert each: a block another
   * process took first is a duplicate key and is skipped. Stops at the first write that gets any.
   */
  private async claim(keyId: string, s: KeyWindow): Promise<void> {
    const now = this.now();
    if (s.claimed.length && now - s.lastClaimAt < QUICK_CLAIM_MS) s.perClaim = Math.min(this.maxPerClaim, s.perClaim * 2);
    s.lastClaimAt = now;
    /** Writes of this claim that found every block taken. */
    let misses = 0;
    for (let run = this.nextRun(s, misses); run; run = this.nextRun(s, misses)) {
      const [first, count] = run;
      const docs = Array.from({ length: count }, (_, i) => ({
        _id: `${keyId}:${s.window}:b${first + i}`,
        key_id: keyId,
        window: s.window,
      }));
      this.claimWrites++;
      let outcomes;
      try {
        outcomes = await insertManyEach(this.blocksOf(s.window), docs);
      } catch (err) {
        this.giveBack(s, first, count); // nothing known to be taken: try these again next time
        throw err;
      }
      let got = 0;
      for (const [i, o] of outcomes.entries()) {
        if (o !== 'inserted') continue; // taken by another process, or refused: not ours either way
        const b = first + i;
        s.claimed.push(docs[i]._id);
        const start = b * this.blockSize + 1;
        const end = Math.min(this.limit, (b + 1) * this.blockSize) + 1;
        s.ranges.push([start, end]);
        s.held += end - start;
        got++;
      }
      const refused = outcomes.find((o): o is Error => o instanceof Error);
      if (got) return;
      if (refused) {
        this.giveBack(s, first, count); // a refused block is not taken: try again next time
        throw refused;
      }
      misses++; // every block taken: the others are ahead
    }
    s.exhausted = true;
  }

  /**
   * The blocks to write next, [first, count]: going forward, then the runs jumped over; null once
   * none is left. After `misses` writes that found everything taken, past the first, it jumps
   * ahead (a claim's worth, doubling each time) when that fits before the end, remembering the
   * blocks jumped over in `skipped`.
   */
  private nextRun(s: KeyWindow, misses: number): [number, number] | null {
    if (s.block < this.blocks) {
      const jump = misses < 2 ? 0 : s.perClaim * 2 ** (misses - 2);
      if (jump && s.block + jump < this.blocks) {
        s.skipped.push([s.block, s.block + jump]);
        s.block += jump;
      }
      const first = s.block;
      const count = Math.min(s.perClaim, this.blocks - first);
      s.block += count;
      return [first, count];
    }
    const run = s.skipped[0];
    if (!run) return null;
    const count = Math.min(s.perClaim, run[1] - run[0]);
    const first = run[0];
    run[0] += count;
    if (run[0] === run[1]) s.skipped.shift();
    return [first, count];
  }

  /** Blocks a write did not get to claim (it failed), to be tried again. */
  private giveBack(s: KeyWindow, first: number, count: number): void {
    if (first + count === s.block) s.block = first;
    else s.skipped.unshift([first, first + count]);
  }

  /**
   * Keys that stopped sending keep their old window's entry until seen again: drop those of past
   * windows. The next drop waits until the map has doubled, so its cost is spread over as many new
   * entries as it walked (a drop at every new key past 10,000, when all were current, cost each
   * key's first request of a window a walk of the whole map).
   */
  private dropStale(window: number): void {
    const stale = [...this.keys].filter(([, k]) => k.window < window);
    for (const [k] of stale) this.keys.delete(k);
    this.retire(stale.map(([, k]) => k));
    this.dropAt = Math.max(MIN_DROP_AT, 2 * this.keys.size);
  }

  /** Deletes finished windows' blocks by `_id` (no scan), in the background: they only take space. */
  private retire(windows: KeyWindow[]): void {
    const byCollection = new Map<string, { coll: Collection<RateTicketDoc>; ops: AnyBulkWriteOperation<RateTicketDoc>[] }>();
    for (const w of windows) {
      if (!w.claimed.length) continue;
      const coll = this.blocksOf(w.window);
      const entry = byCollection.get(coll.collectionName) ?? { coll, ops: [] };
      for (const _id of w.claimed) entry.ops.push({ deleteOne: { filter: { _id } } });
      byCollection.set(coll.collectionName, entry);
    }
    for (const { coll, ops } of byCollection.values()) coll.bulkWrite(ops, { ordered: false }).catch(() => undefined);
  }
}
