// Per-process, short-lived view of each workspace's balance and routing settings, and the spend
// this process holds against it. The ledger stays the truth: a process re-reads it (a few reads by
// `_id`, domain/accounts/credits) in the background once `ttlMs` has passed, and meanwhile counts its own
// spending since.
//
// Bounding spend: a billable call (a synchronous call, a decision, a batch line) first holds an
// estimate of its cost (`hold`), settled to the real cost when it finishes. A call is admitted
// while what the workspace has left, less this process's holds and its spending since the reading,
// is positive. When that is used up by holds of calls still in flight, but the balance itself is
// not, a call waits for one of them to settle instead of being refused: a 402 always means the
// balance (as this process sees it) is spent, and its `balance` is that figure, never one that
// counts estimates. So one process spends at most the credit plus the estimate of the last call it
// admitted. When fewer than LOW_WATER estimates are left, the reading is refreshed before
// admitting (one read at a time per workspace), so other processes' stored spending is seen
// within one read; what they hold in flight then is the rest of the bound: with P processes, at
// most P × (credit left + one estimate).
import { PaymentRequiredError } from '../../infrastructure/errors';
import type { Store, WorkspaceDoc } from '../../infrastructure/store';
import { getBalance, type Balance } from './credits';
import { roundUsd } from '../catalog/usd';
import { Soon } from '../../infrastructure/concurrency/soon';
import { RecentlyUsed } from '../../infrastructure/concurrency/recently-used';

interface Entry {
  credits: number;
  usage: number;
  balance: number;
  settings: WorkspaceDoc['settings'];
  at: number;
  /** `committed` of this workspace's Local when the reading began. */
  committedAtRead: number;
  /** `settles` of this workspace's Local when the reading began. */
  settlesAtRead: number;
  /**
   * False when some of this process's spending reached the ledger while the reading was in flight:
   * the reading may count it, and it is counted as spending since too.
   */
  exact: boolean;
}

/** What this process knows of a workspace: its last reading and its own spending since. */
interface Account {
  /** The last reading of the ledger, if any. */
  reading: Entry | null;
  /** The reading in flight, if any: one at a time. */
  loading: Promise<Entry> | null;
  /** Real cost of every call settled here while this account was kept. */
  committed: number;
  /** Estimates held by calls in flight. */
  held: number;
  /** Settled here through `settleUnstored` whose usage records are not in the ledger yet. */
  unstored: number;
  /** Calls in flight, and calls settled through `settleUnstored` whose records are not stored yet. */
  open: number;
  /** Calls waiting for a hold to end. */
  waiters: Set<() => void>;
  /** How many calls have settled here: a reading taken meanwhile may count some twice. */
  settles: number;
}

export interface Hold {
  /** The call finished and its usage record is stored (or journaled): it was billed `cost`. */
  settle(cost: number): void;
  /**
   * The call finished and was billed `cost`, but its usage record reaches the ledger later (a batch
   * line's is written with its chunk's next group): call the function returned once it has, or once
   * it is known never to.
   */
  settleUnstored(cost: number): () => void;
  /** The call was not billed. */
  release(): void;
}

/** Below this many estimates left, a call waits for a fresh reading. */
const LOW_WATER = 10;
/** Reads of the ledger one reading takes at most while each may count this process's spending twice. */
const RE_READS = 3;

export class SpendAdmission {
  /**
   * Forgetting an account is safe once everything it spent is in the ledger: a fresh reading then
   * counts it all, and spending since starts again from zero.
   */
  private readonly accounts: RecentlyUsed<Account>;
  private readonly refreshes = new Soon();

  constructor(
    private readonly store: Store,
    readonly ttlMs = 5_000,
    private readonly now: () => number = Date.now,
    /** This process's spending already settled but not yet in the ledger (journaled usage records). */
    private readonly unstored: (workspaceId: string) => number = () => 0,
    /** How long a call waits for holds in flight to end before it is refused. */
    private readonly holdWaitMs = 15_000,
    /** A workspace unused this long, with nothing in flight or unstored, is forgotten (read afresh when next used). */
    idleMs?: number,
  ) {
    this.accounts = new RecentlyUsed<Account>({
      idleMs,
      now,
      canDrop: (a, workspaceId) => a.open === 0 && !a.waiters.size && !a.loading && this.unstored(workspaceId) === 0,
    });
  }

  /**
   * The workspace's reading. A fresh one is returned as is; an expired one is returned too while a
   * single background read (started soon, see soon.ts) replaces it, so requests never queue behind
   * the database. Only a workspace not read yet (or forgotten) waits for the store, and every read
   * does with `ttlMs` 0 (no caching).
   */
  private async get(a: Account, workspaceId: string): Promise<Entry> {
    const e = a.reading;
    if (e && this.now() - e.at < this.ttlMs) return e;
    if (e && this.ttlMs > 0) {
      // Not a use of the account: an idle one is not kept alive by its own refresh.
      this.refreshes.run(workspaceId, async () => {
        const current = this.accounts.peek(workspaceId);
        if (current) await this.load(current, workspaceId);
      });
      return e;
    }
    return this.load(a, workspaceId);
  }

  private accountOf(workspaceId: string): Account {
    let a = this.accounts.get(workspaceId);
    if (!a) {
      a = { reading: null, loading: null, committed: 0, held: 0, unstored: 0, open: 0, waiters: new Set(), settles: 0 };
      this.accounts.set(workspaceId, a);
    }
    return a;
  }

  private load(a: Account, workspaceId: string): Promise<Entry> {
    // One read per workspace at a time, however many requests are waiting for it.
    a.loading ??= (async () => {
      // Spending settled while the read is in flight may be counted twice (in the reading and
      // as local spending since it): never less than the truth. Spending settled but not yet
      // stored is not in the reading, so it stays counted as spending since.
      // What of this process's spending the ledger has: it grows only as records are stored.
      const inLedger = () => a.committed - a.unstored - this.unstored(workspaceId);
      // Read again while this process's records reach the ledger during the read (the journal
      // stores a group every 50 ms under load): such a reading may count them twice, in it and as
      // spending since. Up to RE_READS; the last is kept, marked inexact, whatever it is.
      const readOnce = async () => {
        const committedAtRead = inLedger();
        const settlesAtRead = a.settles;
        const [b, ws] = await Promise.all([
          getBalance(this.store, workspaceId),
          this.store.workspaces.findOne({ _id: workspaceId }, { projection: { settings: 1 } }),
        ]);
        return { b, ws, committedAtRead, settlesAtRead, exact: inLedger() === committedAtRead };
      };
      let read = await readOnce();
      for (let reads = 1; !read.exact && reads < RE_READS; reads++) read = await readOnce();
      const { b, ws, committedAtRead, settlesAtRead, exact } = read;
      a.reading = {
        credits: b.total_credits,
        usage: b.total_usage,
        balance: b.balance,
        settings: ws?.settings ?? {},
        at: this.now(),
        committedAtRead,
        settlesAtRead,
        exact,
      };
      return a.reading;
    })().finally(() => (a.loading = null));
    return a.loading;
  }

  /** The balance as of the reading, less this process's spending since: what a 402 reports. */
  private left(a: Account, e: Entry): number {
    // Rounded as balances are, so float residue (1 - 0.9 - 0.1) is not money left.
    return roundUsd(e.balance - (a.committed - e.committedAtRead));
  }

  /** What is left less the estimates held by calls in flight. */
  private available(a: Account, e: Entry): number {
    return roundUsd(this.left(a, e) - a.held);
  }

  /**
   * Credits, usage and balance as of a reading no older than the cache period plus this process's
   * own spending since, so a caller sees its own calls at once and other processes' within the
   * cache period. Reading the ledger sum on every request took seconds under load.
   */
  async balance(workspaceId: string): Promise<Balance> {
    const a = this.accountOf(workspaceId);
    // Never a reading older than the cache period: after a quiet spell the caller waits for a fresh one.
    // Nor an inexact one: it may count some of this process's spending twice (see `load`), the safe
    // side for admitting calls but a wrong balance to show.
    let e = await this.get(a, workspaceId);
    if ((this.ttlMs > 0 && this.now() - e.at >= this.ttlMs) || !e.exact) e = await this.load(a, workspaceId);
    const since = a.committed - e.committedAtRead;
    return { total_credits: e.credits, total_usage: roundUsd(e.usage + since), balance: roundUsd(e.balance - since) };
  }

  /** The workspace's routing settings, as of its last reading. */
  async settings(workspaceId: string): Promise<WorkspaceDoc['settings']> {
    const a = this.accountOf(workspaceId);
    return (await this.get(a, workspaceId)).settings;
  }

  /** 402 unless something is left: the cheap gate every billable route passes before its body is read. */
  async assertCanSpend(workspaceId: string): Promise<void> {
    const a = this.accountOf(workspaceId);
    await this.refuseUnlessLeft(a, workspaceId, await this.get(a, workspaceId));
  }

  /**
   * 402 unless something is left. A reading taken while this process settled calls, or while its
   * usage records reached the ledger, may count some of them twice (stored as it read, still
   * counted as spending since): before refusing on such a reading, read again, so a 402 names the
   * real balance. Refusals with no spending since (a client hammering a spent workspace) cost no read.
   */
  private async refuseUnlessLeft(a: Account, workspaceId: string, e: Entry): Promise<Entry> {
    if (this.left(a, e) <= 0 && (a.settles !== e.settlesAtRead || !e.exact)) e = await this.load(a, workspaceId);
    const left = this.left(a, e);
    if (left <= 0) throw new PaymentRequiredError('Insufficient credits: add credits to this workspace to continue', { balance: left });
    return e;
  }

  /**
   * Holds `estimate` USD for a call about to be made. 402 when the balance is spent; while what is
   * left is only held by calls in flight, waits (up to `waitMs`, `holdWaitMs` unless given, or until
   * `signal` aborts) for one of them to end.
   */
  async hold(workspaceId: string, estimate: number, signal?: AbortSignal, waitMs = this.holdWaitMs): Promise<Hold> {
    const a = this.accountOf(workspaceId);
    a.open++; // from here until its record is stored, the account is not forgotten
    try {
      const deadline = this.now() + waitMs;
      for (;;) {
        let e = await this.get(a, workspaceId);
        if (this.available(a, e) < LOW_WATER * estimate) e = await this.load(a, workspaceId);
        e = await this.refuseUnlessLeft(a, workspaceId, e);
        if (this.available(a, e) > 0 || a.held <= 0) break;
        if (signal?.aborted || this.now() >= deadline) {
          throw new PaymentRequiredError('Insufficient credits: what is left is held by calls still in flight; try again shortly', {
            balance: this.left(a, e),
          });
        }
        await this.holdEnded(a, Math.min(deadline - this.now(), 60_000), signal);
      }
    } catch (err) {
      a.open--;
      throw err;
    }
    a.held += estimate;
    let done = false;
    const end = (cost: number) => {
      if (done) return false;
      done = true;
      a.held -= estimate;
      a.committed += cost;
      a.settles++;
      for (const wake of a.waiters) wake();
      return true;
    };
    return {
      settle: (cost) => {
        if (end(cost)) a.open--;
      },
      release: () => {
        if (end(0)) a.open--;
      },
      settleUnstored: (cost) => {
        if (!end(cost)) return () => undefined;
        a.unstored += cost;
        let stored = false;
        return () => {
          if (stored) return;
          stored = true;
          a.unstored -= cost;
          a.open--;
        };
      },
    };
  }

  /**
   * A billable call under a hold of `estimate` (see `hold`): settled to the cost `call` resolves
   * to, released if it throws. The one path synchronous calls and decisions bill through.
   */
  async billed(workspaceId: string, estimate: number, signal: AbortSignal, call: () => Promise<number>): Promise<void> {
    const hold = await this.hold(workspaceId, estimate, signal);
    try {
      hold.settle(await call());
    } finally {
      hold.release(); // no-op once settled
    }
  }

  /** Resolves when a hold of the workspace ends, after `ms`, or when `signal` aborts. */
  private holdEnded(a: Account, ms: number, signal?: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      const wake = () => {
        clearTimeout(timer);
        a.waiters.delete(wake);
        signal?.removeEventListener('abort', wake);
        resolve();
      };
      const timer = setTimeout(wake, ms);
      a.waiters.add(wake);
      signal?.addEventListener('abort', wake, { once: true });
    });
  }
}
