// Per-process, short-lived view of each workspace's balance and routing settings, so a billable
// request costs no ledger scan (FerretDB scans every usage record for a non-`_id` filter). The
// ledger stays the truth: a process re-reads it in the background once `ttlMs` has passed (or ten
// times the last read's duration, on a large ledger), so the 402 gate can lag other processes'
// spending by that long plus one read, as hosted gateways' balance checks do.
import { PaymentRequiredError } from '../errors';
import type { Store, WorkspaceDoc } from '../store';
import { getBalance } from './credits';

interface Entry {
  balance: number;
  settings: WorkspaceDoc['settings'];
  at: number;
  /** How long this reading is trusted: the TTL, or ten times what the read took if that is longer. */
  ttl: number;
}

export class WorkspaceCache {
  private readonly entries = new Map<string, Entry>();
  private readonly loading = new Map<string, Promise<Entry>>();

  constructor(private readonly store: Store, readonly ttlMs = 5_000, private readonly now: () => number = Date.now) {}

  /**
   * The workspace's entry. A fresh one is returned as is; an expired one is returned too while a
   * single background read replaces it, so requests never queue behind the ledger sum (a scan on
   * FerretDB that takes seconds on a large ledger). Only a workspace never read waits for the store,
   * and every read does with `ttlMs` 0 (no caching).
   */
  async get(workspaceId: string): Promise<Entry> {
    const e = this.entries.get(workspaceId);
    if (e && this.now() - e.at < e.ttl) return e;
    const pending = this.load(workspaceId);
    if (e && this.ttlMs > 0) {
      pending.catch(() => undefined); // the next request after the TTL tries again
      return e;
    }
    return pending;
  }

  private load(workspaceId: string): Promise<Entry> {
    let pending = this.loading.get(workspaceId);
    if (!pending) {
      // One read per workspace at a time, however many requests are waiting for it.
      pending = (async () => {
        const started = this.now();
        const [b, ws] = await Promise.all([getBalance(this.store, workspaceId), this.store.workspaces.findOne({ _id: workspaceId }, { projection: { settings: 1 } })]);
        const at = this.now();
        // The ledger sum scans every usage record on FerretDB (2 s at 30,000 records here): re-reading
        // it no more often than every ten read-times keeps it under a tenth of a core per workspace.
        const entry = { balance: b.balance, settings: ws?.settings ?? {}, at, ttl: this.ttlMs && Math.max(this.ttlMs, 10 * (at - started)) };
        this.entries.set(workspaceId, entry);
        return entry;
      })().finally(() => this.loading.delete(workspaceId));
      this.loading.set(workspaceId, pending);
    }
    return pending;
  }

  /** 402 unless the balance is positive. */
  async assertCanSpend(workspaceId: string): Promise<void> {
    const { balance } = await this.get(workspaceId);
    if (balance <= 0) throw new PaymentRequiredError('Insufficient credits: add credits to this workspace to continue', { balance });
  }

  /** Forget a workspace, e.g. after credits were added through this process. */
  invalidate(workspaceId: string): void {
    this.entries.delete(workspaceId);
  }
}
