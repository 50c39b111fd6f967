// Running totals of the usage ledger, so that a workspace's spending is a few reads by `_id` however
// many usage records it has (summing the records scanned the whole ledger on FerretDB: 1.9 s per
// 100,000 records).
//
// Each ledger (one writer of usage records) keeps one document per workspace it has billed,
// `_id` = `<workspace>:<writer>`, which only it writes: safe on FerretDB, which loses concurrent
// updates to one document. A workspace's spending is the sum of its writers' documents, read as one
// `_id` range. A total never counts a record twice or misses one, even across a crash: before a
// group of records is inserted, each document names the group as `pending` (the ids, and the
// writer and group stamped on the records); a reader adds the pending records that are stored with
// that stamp. A record inserted by another writer first (a retried generation) carries the other's
// stamp, so it is counted once, by that writer.
//
// Writers outlive their processes: a ledger closed with everything stored and settled puts its
// writer id in a pool (`usage_writers`, writer-pool.ts), and the next ledger to start takes one from there and
// goes on writing its documents. Else each process start added a document to every workspace it
// billed, and a balance read grew with restarts (55 µs of FerretDB a document: 57 ms at 1,000).
import { randomBytes } from 'node:crypto';
import type { AnyBulkWriteOperation, Document } from 'mongodb';
import { bulkWriteInParts, workspaceRange, type Store, type UsageDoc } from '../../infrastructure/store';
import { fromJsonText, toJsonText } from '../../infrastructure/store/json-text';
import { fromStoredUsage } from '../../infrastructure/store/usage-form';
import { RecentlyUsed } from '../../infrastructure/concurrency/recently-used';
import { takePooledWriter } from './writer-pool';

export interface UsageTotalDoc extends Document {
  _id: string; // <workspace id>:<writer id>
  workspace_id: string;
  writer: string;
  /** Cost of the records this writer stored for the workspace, pending ones aside. */
  cost: number;
  /** The group being inserted: its records count once stored with this writer and group. */
  /**
   * The ids as JSON text of their list: one field, where a list cost FerretDB per element (an
   * update naming 150 ids: 1.9-3.0 ms of its CPU as a list, 1.2-1.6 as text). A list in documents
   * written by earlier versions.
   */
  pending: { group: number; ids: string | string[] } | null;
  updated_at: Date;
}

export function usageTotals(store: Store) {
  return store.db.collection<UsageTotalDoc>('usage_totals');
}

/** A writer whose ledger closed with all its documents settled, until a starting ledger takes it. */
export interface RetiredWriterDoc extends Document {
  _id: string; // the writer id
  /** The last group it stamped: the next owner goes on from there, so stamps stay unique. */
  groups: number;
  retired_at: Date;
}

export function retiredWriters(store: Store) {
  return store.db.collection<RetiredWriterDoc>('usage_writers');
}

/** The workspace's spending over the whole ledger: its writers' totals and their pending records. */
export async function totalUsage(store: Store, workspaceId: string): Promise<number> {
  const docs = await usageTotals(store)
    .find({ _id: workspaceRange(workspaceId) })
    .toArray();
  let total = 0;
  const pendings: Promise<number>[] = [];
  for (const d of docs) {
    total += d.cost;
    if (!d.pending) continue;
    const ids = pendingIds(d.pending);
    if (ids.length) pendings.push(storedCost(store, d.writer, d.pending.group, ids));
  }
  for (const cost of await Promise.all(pendings)) total += cost;
  return total;
}

function pendingIds(p: NonNullable<UsageTotalDoc['pending']>): string[] {
  return typeof p.ids === 'string' ? fromJsonText<string[]>(p.ids) : p.ids;
}

/** What of a group's records is stored with that writer's stamp. */
async function storedCost(store: Store, writer: string, group: number, ids: string[]): Promise<number> {
  return (await stampedWith(store, writer, group, ids)).reduce((sum, d) => sum + d.cost, 0);
}

/** The records of `ids` stored with this stamp (the stamp is inside the packed record: read by `_id`, then checked). */
async function stampedWith(store: Store, writer: string, group: number, ids: string[]): Promise<UsageDoc[]> {
  const docs = (await store.usage.find({ _id: { $in: ids } }).toArray()).map(fromStoredUsage);
  return docs.filter((d) => d.writer === writer && d.group === group);
}

/**
 * One ledger's side of the totals. The ledger calls `begin` before inserting a group (it stamps
 * the records and announces them), `inserted` after, and `settle` when it has nothing more to
 * write. Calls must not overlap: the ledger writes one group at a time.
 */
export class TotalsWriter {
  /** A new id, unless a retired writer is taken from the pool before the first write. */
  id = `w${Date.now().toString(36)}${randomBytes(6).toString('hex')}`;
  private groups = 0;
  /** Workspaces whose document still names a pending group. */
  private readonly unsettled = new Set<string>();
  /**
   * This writer's stored cost per workspace billed lately (what its documents hold once settled).
   * A settled workspace left unused is forgotten; its document is read by `_id` before it is next
   * rewritten, as are the documents a writer taken from the pool inherits.
   */
  private readonly stored: RecentlyUsed<number>;
  /** A group whose insert failed as a whole: which of its records got in is known only by looking. */
  private unresolved: { group: number; docs: UsageDoc[] } | null = null;
  private readonly started: Promise<void>;
  private retired = false;

  constructor(
    private readonly store: Store,
    opts: { idleMs?: number; now?: () => number } = {},
  ) {
    this.stored = new RecentlyUsed<number>({ ...opts, canDrop: (_, ws) => !this.unsettled.has(ws) });
    this.started = this.take();
  }

  /** Takes a retired writer from the pool (writer-pool.ts); else this writer stays new. */
  private async take(): Promise<void> {
    const w = await takePooledWriter(retiredWriters(this.store));
    if (!w) return;
    this.id = w._id;
    this.groups = w.groups;
  }

  /**
   * Puts the writer in the pool for the next ledger; once every document it wrote is settled (no
   * pending group, no failed insert unresolved) and it writes no more. False when it is not: it is
   * then left as a crashed writer's would be (counted, never written again).
   */
  async retire(): Promise<boolean> {
    await this.started;
    await this.settle();
    if (this.unsettled.size || this.unresolved || this.retired) return false;
    this.retired = true;
    await retiredWriters(this.store).insertOne({ _id: this.id, groups: this.groups, retired_at: new Date() });
    return true;
  }

  /**
   * Stamps the group's records and writes, for each workspace in it, its total with the group
   * pending (and for the others still unsettled, their plain total). A group retried after a failed
   * insert is stamped anew, once what the first attempt stored (under the old stamp) is counted.
   */
  async begin(docs: UsageDoc[]): Promise<void> {
    await this.started;
    if (this.retired) throw new Error('usage totals writer retired');
    await this.resolve();
    const group = ++this.groups;
    const ids = new Map<string, string[]>();
    for (const d of docs) {
      Object.assign(d, { writer: this.id, group });
      const list = ids.get(d.workspace_id);
      if (list) list.push(d._id);
      else ids.set(d.workspace_id, [d._id]);
    }
    await this.write([...new Set([...ids.keys(), ...this.unsettled])], (ws) => {
      const pending = ids.get(ws);
      return pending ? { group, ids: toJsonText(pending) } : null;
    });
  }

  /** After the insert: what it stored (by outcome; 'existing' records belong to other writers). */
  inserted(docs: UsageDoc[], outcomes: ('inserted' | 'existing' | Error)[]): void {
    docs.forEach((d, i) => {
      if (outcomes[i] === 'inserted') this.add(d.workspace_id, d.cost);
    });
  }

  /** After an insert that failed as a whole: the group stays pending until its records are looked up. */
  failed(docs: UsageDoc[]): void {
    // Only a group that was stamped (begin got that far): else nothing of it can be stored.
    if (docs.length && docs[0].writer === this.id && docs[0].group === this.groups)
      this.unresolved = { group: this.groups, docs: [...docs] };
  }

  /** Writes the plain totals of the workspaces still unsettled: the ledger is idle. */
  async settle(): Promise<void> {
    await this.started;
    await this.resolve();
    if (this.unsettled.size) await this.write([...this.unsettled], () => null);
  }

  /** The stored cost of workspaces not in memory (inherited, forgotten or new): one read by `_id`. */
  private async learn(workspaces: string[]): Promise<void> {
    const unknown = workspaces.filter((ws) => this.stored.peek(ws) === undefined);
    if (!unknown.length) return;
    const docs = await usageTotals(this.store)
      .find({ _id: { $in: unknown.map((ws) => `${ws}:${this.id}`) } }, { projection: { workspace_id: 1, cost: 1 } })
      .toArray();
    // Settled, so each document holds its writer's whole cost (pending groups aside).
    const cost = new Map(docs.map((d) => [d.workspace_id, d.cost]));
    for (const ws of unknown) this.stored.set(ws, cost.get(ws) ?? 0);
  }

  /** Only for workspaces of a group begun (so learned, and unsettled until written again). */
  private add(workspaceId: string, cost: number): void {
    this.stored.set(workspaceId, (this.stored.get(workspaceId) ?? 0) + cost);
  }

  /** Counts what a failed group stored (looked up by `_id` with its stamp) before moving on. */
  private async resolve(): Promise<void> {
    const u = this.unresolved;
    if (!u) return;
    const found = await stampedWith(
      this.store,
      this.id,
      u.group,
      u.docs.map((d) => d._id),
    );
    for (const d of found) this.add(d.workspace_id, d.cost);
    this.unresolved = null;
  }

  private async write(workspaces: string[], pendingOf: (ws: string) => UsageTotalDoc['pending']): Promise<void> {
    if (!workspaces.length) return;
    await this.learn(workspaces);
    const now = new Date();
    const ops: AnyBulkWriteOperation<UsageTotalDoc>[] = workspaces.map((ws) => ({
      replaceOne: {
        filter: { _id: `${ws}:${this.id}` },
        replacement: { workspace_id: ws, writer: this.id, cost: this.stored.get(ws)!, pending: pendingOf(ws), updated_at: now },
        upsert: true,
      },
    }));
    await bulkWriteInParts(this.store, usageTotals(this.store), ops);
    for (const ws of workspaces) {
      if (pendingOf(ws)) this.unsettled.add(ws);
      else this.unsettled.delete(ws);
    }
  }
}
