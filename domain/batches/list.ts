// The index that lists a workspace's batches newest first, in bounded reads at any history size.
// Each batch has an entry under `all` and one under its current status, keyed
// `<workspace>:<all|status>:<inverted id>`: the id's characters mapped to their mirror in base 36, so
// the newest batch sorts first and a page is one `_id` range read in index order, stopping at the
// limit (FerretDB reads nothing else from an index; sorting by `created_at` would read the whole
// workspace). A status change adds the new entry before the batch document changes and removes
// the old one after, so a batch is always found under its status; a reader skips stale entries by
// the batch document it reads anyway.
import type { Document, Filter } from 'mongodb';
import { inIdOrder, insertManyNew, type Store } from '../../infrastructure/store';
import type { BatchDoc, BatchStatus } from './store';
import { BATCH_STATUSES } from './schema';

interface ListEntryDoc extends Document {
  _id: string;
  batch_id: string;
  created_at: Date;
}

const DIGITS = '0123456789abcdefghijklmnopqrstuvwxyz';
/** Sorts after every inverted id. */
const END = '~';
/** Characters of the creation time at the start of a batch id (domain/batches/store newBatchId). */
const TIME_CHARS = 9;
const MAX_TIME = 36 ** TIME_CHARS - 1;

function listEntries(store: Store) {
  return store.db.collection<ListEntryDoc>('batch_list');
}

/** Each character mirrored in base 36: the order of ids reversed. */
function invert(s: string): string {
  let out = '';
  for (const c of s) {
    const i = DIGITS.indexOf(c);
    out += i < 0 ? c : DIGITS[35 - i];
  }
  return out;
}

const keyOf = (workspaceId: string, list: string, batchId: string) => `${workspaceId}:${list}:${invert(batchId.slice('batch_'.length))}`;

/** The inverted creation-time prefix of ids made at `ms`. */
const invertedTime = (ms: number) =>
  invert(
    Math.min(Math.max(Math.floor(ms), 0), MAX_TIME)
      .toString(36)
      .padStart(TIME_CHARS, '0'),
  );

/** What the index needs of a batch. */
export type Listed = Pick<BatchDoc, '_id' | 'workspace_id' | 'created_at'>;

/** Entries for a new batch (before its document is stored: an entry without one is skipped). */
export async function addNewBatch(store: Store, b: Listed, status: BatchStatus): Promise<void> {
  // Inserts (an entry already there is a retry's, and the same): cheaper than upserts on FerretDB.
  await insertManyNew(
    listEntries(store),
    ['all', status].map((list) => entryOf(b, list)),
  );
}

const entryOf = (b: Listed, list: string): ListEntryDoc => ({
  _id: keyOf(b.workspace_id, list, b._id),
  batch_id: b._id,
  created_at: b.created_at,
});

/** Moves a batch to `status` in the index around `change`, the write of the batch document. */
export async function moveBatch(store: Store, b: Listed, status: BatchStatus, change: () => Promise<unknown>): Promise<void> {
  await listEntries(store).replaceOne(
    { _id: keyOf(b.workspace_id, status, b._id) },
    { batch_id: b._id, created_at: b.created_at },
    { upsert: true },
  );
  await change();
  await removeEntries(store, b, status);
}

/** Removes a batch's entries (all of them, or all but its current status's). */
export async function removeEntries(store: Store, b: Pick<BatchDoc, '_id' | 'workspace_id'>, keep?: BatchStatus): Promise<void> {
  const lists = keep ? BATCH_STATUSES.filter((s) => s !== keep) : ['all', ...BATCH_STATUSES];
  await listEntries(store).deleteMany({ _id: { $in: lists.map((l) => keyOf(b.workspace_id, l, b._id)) } });
}

export interface ListQuery {
  /** The last batch of the previous page: the page starts after it. */
  after?: string;
  statuses?: BatchStatus[];
  created?: { $gt?: Date; $gte?: Date; $lt?: Date };
  /** How many batches at most. */
  count: number;
}

/**
 * Up to `count` batches, newest first. `load` reads the batch documents of a window of entries (by
 * `_id`); entries whose batch is gone, is another workspace's, or has left the asked statuses are
 * skipped. With several statuses, each status's range is read a window at a time and merged.
 */
export async function listPage(
  store: Store,
  workspaceId: string,
  q: ListQuery,
  load: (ids: string[]) => Promise<BatchDoc[]>,
): Promise<BatchDoc[]> {
  const lists = q.statuses?.length ? [...new Set(q.statuses)] : ['all'];
  // The range of inverted ids to read: after the cursor, and within the creation times asked.
  let from = q.after ? invert(q.after.slice('batch_'.length)) : '';
  const before = q.created?.$lt;
  if (before && invertedTime(before.getTime()) > from) from = invertedTime(before.getTime());
  const since = q.created?.$gt ?? q.created?.$gte;
  const to = since ? invertedTime(since.getTime()) + END : END;
  const createdFilter = q.created && Object.keys(q.created).length ? { created_at: q.created } : {};

  const cursors = lists.map((list) => ({ list, from, done: false }));
  const out: BatchDoc[] = [];
  const seen = new Set<string>();
  while (out.length < q.count && cursors.some((c) => !c.done)) {
    const open = cursors.filter((c) => !c.done);
    const windows = await Promise.all(
      open.map(async (c) => {
        const prefix = `${workspaceId}:${c.list}:`;
        const filter = { _id: { $gt: prefix + c.from, $lt: prefix + to }, ...createdFilter } as Filter<ListEntryDoc>;
        const docs = await inIdOrder(store, listEntries(store).find(filter)).limit(q.count).toArray();
        if (docs.length < q.count) c.done = true;
        return { c, keys: docs.map((d) => ({ inv: d._id.slice(prefix.length), id: d.batch_id })) };
      }),
    );
    // Every range still open has nothing below its last entry unread: merge up to the lowest of those.
    const lasts = windows.filter((w) => !w.c.done).map((w) => w.keys[w.keys.length - 1].inv);
    const upTo = lasts.reduce((min, inv) => (inv < min ? inv : min), END);
    const merged = windows
      .flatMap((w) => w.keys)
      .filter((k) => k.inv <= upTo)
      .sort((x, y) => (x.inv < y.inv ? -1 : x.inv > y.inv ? 1 : 0));
    for (const c of open) if (!c.done) c.from = upTo;
    const ids = [...new Set(merged.map((k) => k.id))].filter((id) => !seen.has(id));
    ids.forEach((id) => seen.add(id));
    const docs = new Map((ids.length ? await load(ids) : []).map((d) => [d._id, d]));
    for (const id of ids) {
      const d = docs.get(id);
      if (!d || d.workspace_id !== workspaceId || (q.statuses?.length && !q.statuses.includes(d.status))) continue;
      out.push(d);
      if (out.length === q.count) break;
    }
  }
  return out;
}
