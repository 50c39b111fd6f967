// Per-process, short-lived view of each workspace's balance and routing settings, and the spend
// this process holds against it. The ledger stays the truth: a process re-reads it in the
// background once `ttlMs` has passed (or ten times the last read's duration, on a large ledger:
// FerretDB scans every usage record to sum them), and meanwhile counts its own spending since.
//
// Bounding spend: a billable call first holds an estimate of its cost (`hold`), settled to the real
// cost when it finishes. A call is admitted while what the workspace has left, less this process's
// holds and its spending since the reading, is positive; so one process overspends by at most the
// estimate of the last call it admitted. When fewer than LOW_WATER estimates are left, the reading
// is refreshed before admitting (one read at a time per workspace, however stale the TTL allows),
// so other processes' spending is seen within one read; what they hold in flight then, up to
// LOW_WATER estimates each, is the rest of the bound.
import { PaymentRequiredError } from '../errors';
import type { Store, WorkspaceDoc } from '../store';
import { getBalance, type Balance } from './credits';
import { roundUsd } from '../catalog/usd';
import { Soon } from './soon';

interface Entry {
  credits: number;
  usage: number;
  balance: number;
  settings: WorkspaceDoc['settings'];
  at: number;
  /** How long this reading is trusted: the TTL, or ten times what the read took if that is longer. */
  ttl: number;
  /** `committed` of this workspace's Local when the reading began. */
  committedAtRead: number;
}

/** This process's own spending on a workspace. */
interface Local {
  /** Real cost of every call settled here, ever. */
  committed: number;
  /** Estimates held by calls in flight. */
  held: number;
}

export interface Hold {
  /** The call finished and was billed `cost`. */
  settle(cost: number): void;
  /** The call was not billed. */
  release(): void;
}

/** Below this many estimates left, a call waits for a fresh reading. */
const LOW_WATER = 10;

export class WorkspaceCache {
  private readonly entries = new Map<string, Entry>();
  private readonly loading = new Map<string, Promise<Entry>>();
  private readonly local = new Map<string, Local>();
  private readonly refreshes = new Soon();

  constructor(
    private readonly store: Store,
    readonly ttlMs = 5_000,
    private readonly now: () => number = Date.now,
    /** This process's spending already settled but not yet in the ledger (journaled usage records). */
    private readonly unstored: (workspaceId: string) => number = () => 0,
  ) {}

  /**
   * The workspace's entry. A fresh one is returned as is; an expired one is returned too while a
   * single background read (started soon, see soon.ts) replaces it, so requests never queue behind
   * the database. Only a workspace never read waits for the store, and every read does with `ttlMs`
   * 0 (no caching).
   */
  async get(workspaceId: string): Promise<Entry> {
    const e = this.entries.get(workspaceId);
    if (e && this.now() - e.at < e.ttl) return e;
    if (e && this.ttlMs > 0) {
      this.refreshes.run(workspaceId, () => this.load(workspaceId));
      return e;
    }
    return this.load(workspaceId);
  }

  private localOf(workspaceId: string): Local {
    let l = this.local.get(workspaceId);
    if (!l) this.local.set(workspaceId, (l = { committed: 0, held: 0 }));
    return l;
  }

  private load(workspaceId: string): Promise<Entry> {
    let pending = this.loading.get(workspaceId);
    if (!pending) {
      // One read per workspace at a time, however many requests are waiting for it.
      pending = (async () => {
        // Spending settled while the read is in flight may be counted twice (in the reading and
        // as local spending since it): never less than the truth. Spending settled but not yet
        // stored is not in the reading, so it stays counted as spending since.
        const committedAtRead = this.localOf(workspaceId).committed - this.unstored(workspaceId);
        const started = this.now();
        const [b, ws] = await Promise.all([
          getBalance(this.store, workspaceId),
          this.store.workspaces.findOne({ _id: workspaceId }, { projection: { settings: 1 } }),
        ]);
        const at = this.now();
        // The ledger sum scans every usage record on FerretDB (2 s at 30,000 records here): re-reading
        // it no more often than every ten read-times keeps it under a tenth of a core per workspace.
        const entry = {
          credits: b.total_credits,
          usage: b.total_usage,
          balance: b.balance,
          settings: ws?.settings ?? {},
          at,
          ttl: this.ttlMs && Math.max(this.ttlMs, 10 * (at - started)),
          committedAtRead,
        };
        this.entries.set(workspaceId, entry);
        return entry;
      })().finally(() => this.loading.delete(workspaceId));
      this.loading.set(workspaceId, pending);
    }
    return pending;
  }

  private available(workspaceId: string, e: Entry): number {
    const l = this.localOf(workspaceId);
    // Rounded as balances are, so float residue (1 - 0.9 - 0.1) is not money left.
    return roundUsd(e.balance - (l.committed - e.committedAtRead) - l.held);
  }

  /**
   * Credits, usage and balance as of the last reading plus this process's own spending since, so
   * a caller sees its own calls at once and other processes' within the cache period. Reading the
   * ledger sum on every request took seconds under load.
   */
  async balance(workspaceId: string): Promise<Balance> {
    const e = await this.get(workspaceId);
    const since = this.localOf(workspaceId).committed - e.committedAtRead;
    return { total_credits: e.credits, total_usage: roundUsd(e.usage + since), balance: roundUsd(e.balance - since) };
  }

  /** 402 unless something is left: the cheap gate every billable route passes before its body is read. */
  async assertCanSpend(workspaceId: string): Promise<void> {
    refuseUnlessLeft(this.available(workspaceId, await this.get(workspaceId)));
  }

  /** Holds `estimate` USD for a call about to be made, or 402 when nothing is left. */
  async hold(workspaceId: string, estimate: number): Promise<Hold> {
    let e = await this.get(workspaceId);
    if (this.available(workspaceId, e) < LOW_WATER * estimate) e = await this.load(workspaceId);
    refuseUnlessLeft(this.available(workspaceId, e));
    const l = this.localOf(workspaceId);
    l.held += estimate;
    let done = false;
    const end = (cost: number) => {
      if (done) return;
      done = true;
      l.held -= estimate;
      l.committed += cost;
    };
    return { settle: end, release: () => end(0) };
  }
}

function refuseUnlessLeft(left: number): void {
  if (left <= 0) throw new PaymentRequiredError('Insufficient credits: add credits to this workspace to continue', { balance: left });
}
