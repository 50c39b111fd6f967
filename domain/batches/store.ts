// The batch document (`batches`): what a batch is, and how it is created, read, listed, shown and
// deleted. Its lines, results and progress live beside it (inputs.ts, results.ts, progress.ts,
// keyed as placement.ts says). Deleting a batch removes its documents by `_id`, a thousand per
// write, in the background behind a durable marker (`batch_deletions`), so nothing is left behind.
//
// A new batch is stored in two steps around its workflow's start: its lines (`storeBatchLines`),
// then the document that makes it visible (`publishBatch`). A batch whose document never comes is
// given up (`abandonBatch`): its `_id` is taken by a document that readers skip.
import { randomBytes } from 'node:crypto';
import type { Collection, Document, Filter } from 'mongodb';
import { isDuplicateKey, type Store } from '../../infrastructure/store';
import { addNewBatch, listPage, moveBatch, removeEntries, type Listed } from './list';
import { fromJsonText, toJsonText } from '../../infrastructure/store/json-text';
import type { BATCH_ENDPOINTS, BATCH_STATUSES } from './schema';
import type { LineCheck } from './lines';
import type { PackedLines } from './packed-lines';
import type { SettledBatches } from './settled-batches';
import { batchChunks, storeInputs } from './inputs';
import { place, seqId } from './placement';
import { pageIds, pages } from './results';

export type BatchStatus = (typeof BATCH_STATUSES)[number];
export type BatchEndpoint = (typeof BATCH_ENDPOINTS)[number];

export interface BatchDoc extends Document {
  _id: string;
  workspace_id: string;
  key_id: string;
  endpoint: BatchEndpoint;
  model: string; // as submitted
  canonical_model: string;
  completion_window: string;
  status: BatchStatus;
  created_at: Date;
  in_progress_at: Date | null;
  finalized_at: Date | null;
  expires_at: Date;
  provider_only: string[] | null;
  total: number;
  chunks: number;
  /** The first line of each chunk (chunks hold consecutive lines): where a results page is found. */
  chunk_starts: number[];
  provider: string | null;
  usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number; cost: number } | null;
  error: { message: string } | null;
  /** JSON text (infrastructure/store/json-text). */
  metadata: string | null;
  /** Counted from the results when the batch closed; live counts come from the progress documents. */
  final_counts?: { completed: number; failed: number };
  /** Where the terminal batch object is posted, if anywhere. */
  callback_url?: string | null;
  /** How the completion webhook went, once it has (delivered, or given up). */
  webhook?: { status: 'delivered' | 'failed'; attempts: number; last_status: number | null; last_error: string | null } | null;
  /** Every line checked against the endpoint's shape at creation; batches stored before this have none, and are checked from their chunks. */
  validation?: LineCheck;
  /** What its lines take against the workspace's storage quota (`storedSize`); none for batches stored before it was counted. */
  stored_bytes?: number;
  /** Session and attribution of the creating request, copied onto each line's usage record. */
  meta: { session_id: string | null; user: string | null; app: { referer: string | null; title: string | null; categories: string[] } };
}

/** `batch_` + time (so ids sort by creation) + randomness. */
export function newBatchId(now = Date.now()): string {
  return `batch_${now.toString(36).padStart(9, '0')}${randomBytes(8).toString('hex')}`;
}

/** What storage needs to know of a batch: its id. */
export type BatchRef = Pick<BatchDoc, '_id'>;

/**
 * The batch documents as stored. Read them with `readBatch`/`readBatches` and write them through
 * this module (which stores the fields in PACKED as the JSON text of their value).
 */
export function batches(store: Store): Collection<BatchDoc> {
  return store.db.collection<BatchDoc>('batches');
}

/**
 * Fields of a batch document stored as the JSON text of their value (objects and arrays, never
 * strings). FerretDB decodes and encodes an object or array per element on every read and write,
 * and batch documents are read on every poll, list and chunk: 100 documents cost it 24–30 ms of CPU
 * as they were and 20–21 packed, or, with 100 chunks each, 61–66 and 20–22. Documents written before
 * hold them as they were, and read the same.
 */
const PACKED = ['chunk_starts', 'meta', 'validation', 'provider_only', 'usage', 'error', 'final_counts', 'webhook'] as const;

/** `doc` (a whole batch document, or fields to `$set`) as stored. */
function packed<T extends Partial<BatchDoc>>(doc: T): T {
  const out: Record<string, unknown> = { ...doc };
  for (const k of PACKED) if (out[k] !== undefined && out[k] !== null) out[k] = toJsonText(out[k]);
  return out as T;
}

function unpacked(stored: BatchDoc): BatchDoc {
  const out: Record<string, unknown> = stored;
  for (const k of PACKED) if (typeof out[k] === 'string') out[k] = fromJsonText(out[k] as string);
  return stored;
}

/** How a closed batch's webhook went (delivered, or given up), once it has. */
export async function recordWebhookOutcome(store: Store, batchId: string, outcome: NonNullable<BatchDoc['webhook']>): Promise<void> {
  await batches(store).updateOne({ _id: batchId }, { $set: packed({ webhook: outcome }) });
}

/** A batch document by id, whatever its workspace. */
export async function readBatch(store: Store, id: string): Promise<BatchDoc | null> {
  const b = await batches(store).findOne({ _id: id });
  return b && !isAbandoned(b) ? unpacked(b) : null;
}

/** A new batch's document as its workflow waits for it: not there yet (null), stored, or given up. */
export async function readNewBatch(store: Store, id: string): Promise<BatchDoc | 'abandoned' | null> {
  const b = await batches(store).findOne({ _id: id });
  if (!b) return null;
  return isAbandoned(b) ? 'abandoned' : unpacked(b);
}

/** A batch given up before it was stored (`abandonBatch`) is not a batch. */
const isAbandoned = (b: BatchDoc) => (b as Partial<AbandonedDoc>).abandoned === true;

/** The batch documents among `ids`: those `settled` keeps, and one read of the rest. */
async function readBatches(store: Store, ids: string[], settled?: SettledBatches): Promise<BatchDoc[]> {
  const kept: BatchDoc[] = [];
  const unread: string[] = [];
  for (const id of ids) {
    const b = settled?.get(id);
    if (b) kept.push(b);
    else unread.push(id);
  }
  if (!unread.length) return kept;
  const read = (
    await batches(store)
      .find({ _id: { $in: unread } })
      .toArray()
  )
    .filter((b) => !isAbandoned(b))
    .map(unpacked);
  if (settled) for (const b of read) settled.keep(b);
  return kept.concat(read);
}

/** Deletes documents by `_id`, a thousand per write. */
async function deleteIds<T extends { _id: string }>(coll: Collection<T>, ids: string[]): Promise<void> {
  for (let i = 0; i < ids.length; i += 1000) {
    await coll.bulkWrite(
      ids.slice(i, i + 1000).map((_id) => ({ deleteOne: { filter: { _id } as Filter<T> } })),
      { ordered: false },
    );
  }
}

/** Removes a batch's inputs, results, progress and pages: what `chunks` and `total` say it can have. */
async function dropBatchData(
  store: Store,
  b: BatchRef & Pick<BatchDoc, 'chunks' | 'total' | 'chunk_starts'> & Partial<Pick<BatchDoc, 'workspace_id'>>,
): Promise<void> {
  if (b.workspace_id) await removeEntries(store, { _id: b._id, workspace_id: b.workspace_id });
  const chunkKeys = Array.from({ length: b.chunks }, (_, i) => seqId(i));
  for (const kind of ['inputs', 'progress'] as const) {
    const { coll, id } = place<{ _id: string }>(store, b, kind);
    await deleteIds(coll, chunkKeys.map(id));
  }
  const { coll, id } = place<{ _id: string }>(store, b, 'results');
  await deleteIds(
    coll,
    Array.from({ length: b.total }, (_, n) => id(seqId(n))),
  );
  await deleteIds(pages(store), pageIds(b));
}

const unix = (d: Date | null) => (d ? Math.floor(d.getTime() / 1000) : null);

export function batchView(b: BatchDoc, c: { completed: number; failed: number }) {
  return {
    id: b._id,
    object: 'batch' as const,
    endpoint: b.endpoint,
    model: b.model,
    completion_window: b.completion_window,
    status: b.status,
    created_at: unix(b.created_at)!,
    in_progress_at: unix(b.in_progress_at),
    finalized_at: unix(b.finalized_at),
    expires_at: unix(b.expires_at),
    // A batch refused as a whole (invalid lines) counts every line as failed.
    provider: b.provider,
    request_counts: {
      total: b.total,
      completed: c.completed,
      failed: b.status === 'failed' && c.completed + c.failed === 0 ? b.total : c.failed,
    },
    usage: b.usage,
    results: null as unknown[] | null,
    error: b.error,
    metadata: b.metadata && fromJsonText(b.metadata),
    callback_url: b.callback_url ?? null,
    webhook: b.webhook ?? null,
  };
}

/** A batch of the workspace, or null (another workspace's batch is not found either). */
export async function findBatch(store: Store, workspaceId: string, id: string): Promise<BatchDoc | null> {
  const b = await readBatch(store, id);
  return b && b.workspace_id === workspaceId ? b : null;
}

/**
 * Stores a new batch's lines and list entries, not yet its document: until `publishBatch` the batch
 * is not visible. Returns the document to publish. A batch that cannot be stored leaves nothing behind.
 * `writeInputs` stores the lines (the API's stores a large batch's on the thread that read them).
 */
export async function storeBatchLines(
  store: Store,
  doc: BatchDoc,
  lines: PackedLines,
  chunkSize: number,
  writeInputs: typeof storeInputs = storeInputs,
): Promise<BatchDoc> {
  const writes = [writeInputs(store, doc, lines, chunkSize), addNewBatch(store, doc, doc.status)] as const;
  try {
    const [starts] = await Promise.all(writes);
    return { ...doc, chunks: starts.length, chunk_starts: starts };
  } catch (err) {
    // Once every write has ended, so that all of them are undone.
    await Promise.allSettled(writes);
    await dropBatchData(store, { ...doc, chunks: batchChunks(lines, chunkSize), total: 0 }).catch(() => undefined);
    throw err;
  }
}

/** The batch was given up before its document was stored (`abandonBatch`): it was never created. */
export class BatchAbandonedError extends Error {
  constructor(id: string) {
    super(`batch ${id} was given up before it was stored`);
  }
}

/**
 * Makes a stored batch visible: inserts its document. Refused (BatchAbandonedError) when the batch
 * was given up first, by its workflow or by the API: one insert of the `_id` decides, atomic on
 * FerretDB too. Its own earlier insert (a retried write) counts as done.
 */
export async function publishBatch(store: Store, stored: BatchDoc): Promise<void> {
  try {
    await batches(store).insertOne(packed(stored));
  } catch (err) {
    if (!isDuplicateKey(err)) throw err;
    const there = await batches(store).findOne({ _id: stored._id }, { projection: { abandoned: 1 } });
    if (!there || (there as Partial<AbandonedDoc>).abandoned) throw new BatchAbandonedError(stored._id);
  }
}

/** What stands for a batch that was given up before it was stored: never visible, never run. */
interface AbandonedDoc {
  _id: string;
  abandoned: true;
  abandoned_at: Date;
}

/**
 * Gives up a batch whose document is not stored: its workflow could not be started, or it started
 * and the document never came (the API failed or died in between). Inserts the `_id` as abandoned,
 * so a late `publishBatch` is refused and the workflow, if there is one, runs nothing. Returns the
 * batch document instead if it was published first.
 */
export async function abandonBatch(store: Store, id: string): Promise<BatchDoc | null> {
  const doc: AbandonedDoc = { _id: id, abandoned: true, abandoned_at: new Date() };
  try {
    await batches(store).insertOne(doc as unknown as BatchDoc);
    return null;
  } catch (err) {
    if (!isDuplicateKey(err)) throw err;
    return readBatch(store, id); // null: abandoned already
  }
}

/** Removes what a batch that was never published may have stored: its lines and list entries. */
export async function dropUnpublished(store: Store, b: BatchRef & Pick<BatchDoc, 'chunks' | 'workspace_id'>): Promise<void> {
  await dropBatchData(store, { ...b, total: 0, chunk_starts: [] });
}

/**
 * Stores a new batch and makes it visible at once (tests, and batches made without a workflow);
 * the API starts the workflow between the two steps.
 */
export async function createBatch(store: Store, doc: BatchDoc, lines: PackedLines, chunkSize: number): Promise<BatchDoc> {
  const stored = await storeBatchLines(store, doc, lines, chunkSize);
  await publishBatch(store, stored);
  return stored;
}

/** Writes a batch's status (and `set`'s other fields), keeping the list index in step. */
export async function writeStatus(store: Store, b: Listed, set: Partial<BatchDoc> & { status: BatchStatus }): Promise<void> {
  await moveBatch(store, b, set.status, () => batches(store).updateOne({ _id: b._id }, { $set: packed(set) }));
}

/** A page of the workspace's batches, newest first, one more than `limit` to tell whether more follow. */
export async function listBatches(
  store: Store,
  workspaceId: string,
  q: { after?: string; statuses?: BatchStatus[]; created?: Record<string, Date>; limit: number },
  settled?: SettledBatches,
): Promise<BatchDoc[]> {
  return listPage(store, workspaceId, { after: q.after, statuses: q.statuses, created: q.created, count: q.limit + 1 }, (ids) =>
    readBatches(store, ids, settled),
  );
}

/** What a deletion still has to remove (the batch's document is gone already). */
interface DeletionDoc extends Document {
  _id: string; // the batch id
  batch: BatchRef & Pick<BatchDoc, 'chunks' | 'total' | 'chunk_starts' | 'workspace_id'>;
}

function deletions(store: Store): Collection<DeletionDoc> {
  return store.db.collection<DeletionDoc>('batch_deletions');
}

/**
 * Deletes a batch: a durable marker first, then its document (from then on it is not found), then
 * its lines in the background (`purgeDeleted`), which any process finishes if this one stops.
 */
/** Deletes a batch (its lines go in the background, `purgeDeleted`); true for the call that deleted it. */
export async function deleteBatch(store: Store, b: BatchDoc): Promise<boolean> {
  const batch = {
    _id: b._id,
    chunks: b.chunks,
    total: b.total,
    chunk_starts: b.chunk_starts,
    workspace_id: b.workspace_id,
  };
  await deletions(store)
    .insertOne({ _id: b._id, batch })
    .catch((err) => {
      if ((err as { code?: number }).code !== 11000) throw err; // already being deleted
    });
  // Lists stop finding it before its document goes: a process may keep the document (settled-batches.ts).
  await removeEntries(store, b);
  return (await batches(store).deleteOne({ _id: b._id })).deletedCount === 1;
}

/**
 * Removes the lines of deleted batches, at most `max` batches per call, and their markers once
 * done. Idempotent: several processes may work on one deletion. The marker collection holds only
 * deletions still in progress, so reading it whole is bounded.
 */
export async function purgeDeleted(store: Store, max = 5): Promise<number> {
  const pending = await deletions(store).find({}).limit(max).toArray();
  for (const d of pending) {
    await dropBatchData(store, d.batch);
    await deletions(store).deleteOne({ _id: d._id });
  }
  return pending.length;
}
