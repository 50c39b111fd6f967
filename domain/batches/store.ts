// Batch storage. The batch document lives in `batches`; a batch's input chunks, results (one
// document per line holding its JSON text, written once: the first write of a line wins) and per-chunk progress live in
// collections shared by every batch (`batch_inputs`, `batch_results`, `batch_progress`), each
// document's `_id` the batch id and its own key (`<batch id>:<seqId>`), so every read and write is by
// `_id` and a new batch creates no collection: on FerretDB each collection is a table with catalogue
// entries that every later operation pays for, and on MongoDB thousands of collections are an
// anti-pattern too.
//
// Once a chunk is finished its results are also stored as pages of RESULTS_PAGE_LINES lines
// (`batch_pages`), which is what readers read: any page of results costs one or two reads by `_id`,
// whatever the batch's size. Deleting a batch removes its documents by `_id`, a thousand per write,
// in the background behind a durable marker (`batch_deletions`), so nothing is left behind.
//
// A new batch is stored in two steps around its workflow's start: its lines (`storeBatchLines`),
// then the document that makes it visible (`publishBatch`). A batch whose document never comes is
// given up (`abandonBatch`): its `_id` is taken by a document that readers skip.
import { randomBytes } from 'node:crypto';
import type { Collection, Document, Filter } from 'mongodb';
import { insertManyNew, isDuplicateKey, type Store } from '../../infrastructure/store';
import { addNewBatch, listPage, moveBatch, removeEntries, type Listed } from './list';
import { fromJsonText, toJsonText } from '../../infrastructure/store/json-text';
import type { BATCH_ENDPOINTS, BATCH_STATUSES } from './schema';
import type { LineCheck } from './lines';
import { bodyBytes, lineCount, unpackLines, type PackedLines } from './packed-lines';
import type { PageCache } from './page-cache';
import type { SettledBatches } from './settled-batches';
import { packPage, unpackPage, type PageDoc, type ResultPage } from './page-form';

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

/**
 * Chunk, progress and result ids are zero-padded strings, not numbers: FerretDB turns only a
 * string (or ObjectId) `_id` equality into an indexed SQLite lookup, and padding keeps their
 * lexical order the numeric one.
 */
export function seqId(n: number): string {
  return n.toString().padStart(9, '0');
}

/** One request line; its body is kept as its JSON text, so any key a caller may send (`$ref` in a schema, a dotted name) is stored as sent and its size is known before it is written. */
export interface InputLine {
  line: number;
  custom_id: string;
  body: string;
}

/** One input chunk: consecutive lines. */
export interface InputChunk {
  lines: InputLine[];
}

/**
 * How a chunk is stored: its lines' custom ids and bodies as two arrays of strings, the lines
 * numbered on from `first`. FerretDB converts every field it reads or writes, so a chunk of 250
 * lines stored as objects cost it 9 ms of CPU per read and 2.6 per write; as arrays, 3.5 and 1.0
 * (measured). Chunks stored as objects by earlier versions (`lines`) are still read.
 */
interface StoredChunkDoc extends Document {
  _id: string; // <batch id>:seqId(chunk index)
  first: number;
  custom_ids: string[];
  bodies: string[];
}

/** A chunk stays well under MongoDB's 16 MB document limit; a single line may use all of it. */
export const MAX_CHUNK_BYTES = 8 * 1024 * 1024;

export function lineBody(l: InputLine): Record<string, unknown> {
  return JSON.parse(l.body);
}

export interface ResultDoc extends Document {
  _id: string; // seqId(line)
  line: number;
  custom_id: string;
  id: string;
  ok: boolean;
  response: { status_code: number; request_id: string; body: unknown } | null;
  error: { type: string; message: string; code?: number } | null;
  provider: string | null;
  usage: { input_tokens: number; output_tokens: number; cost: number } | null;
}

/**
 * How a result is stored: its fields as one JSON text beside its `_id`. FerretDB's cost of a
 * write grows with the fields it converts, not the documents: a result as a document of nested
 * fields cost it ~0.1 ms per line, as text ~0.02 (measured). The text is never queried into.
 */
interface StoredResultDoc extends Document {
  _id: string; // <batch id>:seqId(line)
  text: string;
}

function storedResult(id: string, r: ResultDoc): StoredResultDoc {
  const { _id, ...fields } = r;
  return { _id: id, text: JSON.stringify(fields) };
}

function resultFromStored(doc: StoredResultDoc | ResultDoc): ResultDoc {
  // A result stored by an earlier version is a document of fields.
  return local(typeof doc.text === 'string' ? { ...JSON.parse(doc.text), _id: doc._id } : (doc as ResultDoc));
}

/** The generation id of one line's call (and of its usage record). */
export function lineGenerationId(batchId: string, line: number): string {
  return `gen-batch-${batchId.slice('batch_'.length)}-${line}`;
}

/** A line's result when it failed (or was never run): the one shape of a failed line. */
export function failedResult(
  batchId: string,
  line: InputLine,
  error: NonNullable<ResultDoc['error']>,
  provider: string | null = null,
): ResultDoc {
  return {
    _id: seqId(line.line),
    line: line.line,
    custom_id: line.custom_id,
    id: lineGenerationId(batchId, line.line),
    ok: false,
    provider,
    response: null,
    error,
    usage: null,
  };
}

/** `batch_` + time (so ids sort by creation) + randomness. */
export function newBatchId(now = Date.now()): string {
  return `batch_${now.toString(36).padStart(9, '0')}${randomBytes(8).toString('hex')}`;
}

/** What storage needs to know of a batch: its id. */
export type BatchRef = Pick<BatchDoc, '_id'>;

/** The shared collection of one kind, and the `_id` of the batch's document with a given key. */
function place<T extends Document>(store: Store, b: BatchRef, kind: 'inputs' | 'results' | 'progress') {
  return { coll: store.db.collection<T>(`batch_${kind}`), id: (key: string) => `${b._id}:${key}` };
}

/** A stored document with its batch-local `_id` back (the key the rest of the code uses). */
const local = <T extends { _id: string }>(doc: T): T => ({ ...doc, _id: doc._id.slice(doc._id.lastIndexOf(':') + 1) });

/** One input chunk. */
export async function readChunk(store: Store, b: BatchRef, chunkIndex: number): Promise<InputChunk | null> {
  const { coll, id } = place<StoredChunkDoc & { lines?: InputLine[] }>(store, b, 'inputs');
  const doc = await coll.findOne({ _id: id(seqId(chunkIndex)) });
  if (!doc) return null;
  if (doc.lines) return { lines: doc.lines }; // stored by an earlier version
  return { lines: doc.bodies.map((body, i) => ({ line: doc.first + i, custom_id: doc.custom_ids[i], body })) };
}

/** Every input chunk in order, each read while the caller works on the one before. */
export async function* eachChunk(
  store: Store,
  b: BatchRef & Pick<BatchDoc, 'chunks'>,
): AsyncGenerator<{ index: number; chunk: InputChunk | null }> {
  const read = (i: number) => {
    const reading = readChunk(store, b, i);
    reading.catch(() => undefined); // a caller that stops early leaves no unhandled rejection; an awaited one still throws
    return reading;
  };
  let next = b.chunks > 0 ? read(0) : null;
  for (let index = 0; index < b.chunks; index++) {
    const chunk = await next!;
    next = index + 1 < b.chunks ? read(index + 1) : null;
    yield { index, chunk };
  }
}

/**
 * Writes results that may already be stored (a retried chunk, a late write racing a close) in one
 * unordered insert, and returns what is stored for each line: the first write of a line wins.
 */
export async function writeResultsOnce(store: Store, b: BatchRef, docs: ResultDoc[]): Promise<ResultDoc[]> {
  const { coll, id } = place<StoredResultDoc>(store, b, 'results');
  const dup = await insertManyNew(
    coll,
    docs.map((d) => storedResult(id(d._id), d)),
  );
  if (!dup.size) return docs;
  // Rare (a retry): read the earlier ones back one by one, by _id.
  const earlier = await resultsOf(
    store,
    b,
    docs.filter((d) => dup.has(id(d._id))).map((d) => d.line),
  );
  const byLine = new Map(earlier.map((r) => [r.line, r]));
  return docs.map((r) => byLine.get(r.line) ?? r);
}

/** A chunk's tally so far: what it finished, what that cost, and who served it. */
export interface ChunkTally {
  completed: number;
  failed: number;
  input_tokens: number;
  output_tokens: number;
  cost: number;
  providers: Record<string, number>;
}

export function emptyTally(): ChunkTally {
  return { completed: 0, failed: 0, input_tokens: 0, output_tokens: 0, cost: 0, providers: {} };
}

/** Counts one stored result into a tally. */
export function addToTally(t: ChunkTally, r: Pick<ResultDoc, 'ok' | 'usage' | 'provider'>): void {
  t[r.ok ? 'completed' : 'failed']++;
  if (!r.ok) return;
  if (r.usage) {
    t.input_tokens += r.usage.input_tokens;
    t.output_tokens += r.usage.output_tokens;
    t.cost += r.usage.cost;
  }
  if (r.provider) t.providers[r.provider] = (t.providers[r.provider] ?? 0) + 1;
}

/** One small document per chunk, written only by that chunk's activity. */
export interface ProgressDoc extends Document, ChunkTally {
  _id: string; // seqId(chunk index)
  /** Lines whose results are stored: where a retried chunk resumes. */
  done?: number[];
  /** completed + failed, for the never-backwards guard. */
  n?: number;
}

export function pickTally(d: ChunkTally): ChunkTally {
  return {
    completed: d.completed,
    failed: d.failed,
    input_tokens: d.input_tokens ?? 0,
    output_tokens: d.output_tokens ?? 0,
    cost: d.cost ?? 0,
    providers: d.providers ?? {},
  };
}

/**
 * How a progress document stores its done lines: as runs, `[first, last, first, last, …]`. A
 * chunk's done lines are few runs, and the document is written again after every group: as a list
 * of line numbers it grew with the chunk, and FerretDB's cost with it. The runs are stored as the
 * JSON text of their list: FerretDB spends per element of an array on every read and write,
 * though a reader asks only for the counts (200 documents of 24 runs: 40-50 ms of its CPU as
 * arrays, 22-24 as text; of 100 runs, 83-121 and 28-35). Documents of earlier versions hold the
 * runs as an array, or the list of lines (`done`).
 */
interface StoredProgressDoc extends Document, ChunkTally {
  _id: string;
  n?: number;
  done_runs?: string | number[];
  done?: number[];
}

/** Sorted, distinct line numbers as runs. */
function toRuns(lines: number[]): number[] {
  const sorted = [...lines].sort((x, y) => x - y);
  const runs: number[] = [];
  for (const n of sorted) {
    const last = runs.length - 1;
    if (last > 0 && n <= runs[last] + 1) runs[last] = Math.max(runs[last], n);
    else runs.push(n, n);
  }
  return runs;
}

function fromRuns(runs: number[]): number[] {
  const lines: number[] = [];
  for (let i = 0; i + 1 < runs.length; i += 2) for (let n = runs[i]; n <= runs[i + 1]; n++) lines.push(n);
  return lines;
}

/**
 * Saves a chunk's tally unless a larger one is already stored (an older attempt of the same chunk
 * still running), so the counts clients see never go backwards. (The filter names the `_id`: an
 * indexed lookup, FerretDB's included with the build's patch.)
 */
export async function saveProgress(store: Store, b: BatchRef, chunkIndex: number, tally: ChunkTally, done: number[]): Promise<void> {
  const { coll, id } = place<StoredProgressDoc>(store, b, 'progress');
  const n = tally.completed + tally.failed;
  const doc: StoredProgressDoc = { _id: id(seqId(chunkIndex)), ...pickTally(tally), done_runs: toJsonText(toRuns(done)), n };
  try {
    await coll.replaceOne({ _id: doc._id, $or: [{ n: { $lte: n } }, { n: { $exists: false } }] }, doc, { upsert: true });
  } catch (err) {
    // The filter missed because a larger tally is stored, and the upsert hit its _id: keep that one.
    if ((err as { code?: number }).code !== 11000) throw err;
  }
}

/** One chunk's progress document, if it has one yet. */
export async function readProgress(store: Store, b: BatchRef, chunkIndex: number): Promise<ProgressDoc | null> {
  const { coll, id } = place<StoredProgressDoc>(store, b, 'progress');
  const d = await coll.findOne({ _id: id(seqId(chunkIndex)) });
  if (!d) return null;
  const { done_runs: runs, ...rest } = d;
  return local({
    ...rest,
    done: runs ? fromRuns(typeof runs === 'string' ? fromJsonText<number[]>(runs) : runs) : (d.done ?? []),
  } as ProgressDoc);
}

/** Chunks of any batches, named for a read of their counts. */
export type ChunkRef = { b: BatchRef; chunkIndex: number };

/**
 * The completed and failed counts of chunks' progress documents, of any batches, in one read (an
 * `_id` set, which the embedded FerretDB answers from its index); a chunk not started has none.
 * Keyed by position in `chunks`.
 */
export async function progressCounts(store: Store, chunks: ChunkRef[]): Promise<({ completed: number; failed: number } | undefined)[]> {
  if (!chunks.length) return [];
  const ids = chunks.map((c) => place(store, c.b, 'progress').id(seqId(c.chunkIndex)));
  // Every batch's progress documents are in one collection.
  const docs = await place<StoredProgressDoc>(store, chunks[0].b, 'progress')
    .coll.find({ _id: { $in: ids } }, { projection: { completed: 1, failed: 1 } })
    .toArray();
  const byId = new Map(docs.map((d) => [d._id, { completed: d.completed, failed: d.failed }]));
  return ids.map((id) => byId.get(id));
}

/** Every chunk's progress document (by `_id`, one per chunk). */
export async function allProgress(store: Store, b: BatchRef & Pick<BatchDoc, 'chunks'>): Promise<ProgressDoc[]> {
  const docs = await Promise.all(Array.from({ length: b.chunks }, (_, i) => readProgress(store, b, i)));
  return docs.filter((d): d is ProgressDoc => d !== null);
}

/**
 * The batch documents as stored. Read them with `readBatch`/`readBatches` and write them with
 * `packed`: the fields in PACKED are stored as the JSON text of their value.
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
export function packed<T extends Partial<BatchDoc>>(doc: T): T {
  const out: Record<string, unknown> = { ...doc };
  for (const k of PACKED) if (out[k] !== undefined && out[k] !== null) out[k] = toJsonText(out[k]);
  return out as T;
}

function unpacked(stored: BatchDoc): BatchDoc {
  const out: Record<string, unknown> = stored;
  for (const k of PACKED) if (typeof out[k] === 'string') out[k] = fromJsonText(out[k] as string);
  return stored;
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

/** Where each chunk of the lines starts: at most `chunkSize` lines and MAX_CHUNK_BYTES of bodies each. */
function chunkStarts(lines: PackedLines, chunkSize: number): number[] {
  const starts: number[] = [];
  let count = 0;
  let bytes = 0;
  for (let i = 0; i < lineCount(lines); i++) {
    const size = bodyBytes(lines, i);
    if (!count || count >= chunkSize || bytes + size > MAX_CHUNK_BYTES) {
      starts.push(i);
      count = 0;
      bytes = 0;
    }
    count++;
    bytes += size;
  }
  return starts;
}

/**
 * An insert of input chunks carries at most this many bodies' bytes, or 20 chunks: the driver
 * serialises an insert in one piece, ~3.5 ms per MB of the event loop (20 chunks of 1.75 MB held it
 * for 126 ms). Bodies become text only as their insert is made.
 */
const INSERT_BYTES = 4 * 1024 * 1024;
const INSERT_CHUNKS = 20;

/** Stores the input lines in chunks; returns each chunk's first line. Idempotent: a retried write changes nothing. */
export async function storeInputs(store: Store, b: BatchRef, lines: PackedLines, chunkSize: number): Promise<number[]> {
  const { coll, id } = place<StoredChunkDoc>(store, b, 'inputs');
  const starts = chunkStarts(lines, chunkSize);
  const end = (c: number) => (c + 1 < starts.length ? starts[c + 1] : lineCount(lines));
  for (let c = 0; c < starts.length;) {
    const group: StoredChunkDoc[] = [];
    for (let bytes = 0; c < starts.length && group.length < INSERT_CHUNKS; c++) {
      const size = bodyBytes(lines, starts[c], end(c));
      if (group.length && bytes + size > INSERT_BYTES) break;
      bytes += size;
      const ls = unpackLines(lines, starts[c], end(c));
      group.push({ _id: id(seqId(c)), first: starts[c], custom_ids: ls.map((l) => l.custom_id), bodies: ls.map((l) => l.body) });
    }
    // The driver splits an insert into messages under the server's size limit.
    await insertManyNew(coll, group);
  }
  return starts;
}

/** The chunks' tallies added up. */
export async function sumProgress(store: Store, b: BatchRef & Pick<BatchDoc, 'chunks'>): Promise<ChunkTally> {
  return tallyOf(await allProgress(store, b));
}

/** Progress documents' tallies added up. */
export function tallyOf(progress: ProgressDoc[]): ChunkTally {
  const total = emptyTally();
  for (const d of progress) {
    total.completed += d.completed;
    total.failed += d.failed;
    total.input_tokens += d.input_tokens ?? 0;
    total.output_tokens += d.output_tokens ?? 0;
    total.cost += d.cost ?? 0;
    for (const [p, n] of Object.entries(d.providers ?? {})) total.providers[p] = (total.providers[p] ?? 0) + n;
  }
  return total;
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

function resultLine(r: ResultDoc) {
  return { id: r.id, custom_id: r.custom_id, response: r.response, error: r.error };
}

/** A batch of the workspace, or null (another workspace's batch is not found either). */
export async function findBatch(store: Store, workspaceId: string, id: string): Promise<BatchDoc | null> {
  const b = await readBatch(store, id);
  return b && b.workspace_id === workspaceId ? b : null;
}

/**
 * Stores a new batch's lines and list entries, not yet its document: until `publishBatch` the batch
 * is not visible. Returns the document to publish. A batch that cannot be stored leaves nothing behind.
 */
export async function storeBatchLines(store: Store, doc: BatchDoc, lines: PackedLines, chunkSize: number): Promise<BatchDoc> {
  const writes = [storeInputs(store, doc, lines, chunkSize), addNewBatch(store, doc, doc.status)] as const;
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

/** How many chunks `storeBatchLines` stores the lines in. */
export function batchChunks(lines: PackedLines, chunkSize: number): number {
  return chunkStarts(lines, chunkSize).length;
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

/** Lines per page of stored results. */
const RESULTS_PAGE_LINES = 100;
/** Pages a download reads at once. */
const READ_AHEAD_PAGES = 8;
/** A page larger than this is not stored: its lines are read one by one. */
const MAX_PAGE_BYTES = 8 * 1024 * 1024;

/** Pages of finished chunks' results, 100 lines each (how a page is stored: page-form.ts). */
export function pages(store: Store): Collection<PageDoc> {
  return store.db.collection<PageDoc>('batch_pages');
}

const pageId = (batchId: string, chunk: number, page: number) => `${batchId}:${seqId(chunk)}.${seqId(page)}`;

/** Where chunk `c` ends: the next chunk's first line, or the batch's end. */
const chunkEnd = (starts: number[], total: number, c: number) => (c + 1 < starts.length ? starts[c + 1] : total);

/** How many lines chunk `c` holds. */
export function chunkLines(b: Pick<BatchDoc, 'chunk_starts' | 'total'>, c: number): number {
  return chunkEnd(b.chunk_starts, b.total, c) - b.chunk_starts[c];
}

/** The `_id` of every page a batch can have (pages of unfinished chunks do not exist). */
function pageIds(b: Pick<BatchDoc, '_id' | 'chunk_starts' | 'total'>): string[] {
  return b.chunk_starts.flatMap((_, c) =>
    Array.from({ length: Math.ceil(chunkLines(b, c) / RESULTS_PAGE_LINES) }, (_, p) => pageId(b._id, c, p)),
  );
}

/** The chunk holding line `n`, and the bounds of the page it is on. */
function locate(starts: number[], total: number, n: number) {
  let lo = 0;
  let hi = starts.length - 1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (starts[mid] <= n) lo = mid;
    else hi = mid - 1;
  }
  const end = chunkEnd(starts, total, lo);
  const page = Math.floor((n - starts[lo]) / RESULTS_PAGE_LINES);
  const first = starts[lo] + page * RESULTS_PAGE_LINES;
  return { chunk: lo, page, first, end: Math.min(first + RESULTS_PAGE_LINES, end), chunkEnd: end };
}

/**
 * Stores a finished chunk's results as pages: `known` are those at hand (what this run wrote), the
 * rest are read back by `_id` (at most a chunk's worth). Idempotent: a chunk paged already is left
 * as it is, and a page stored already is kept (each line's first stored result wins).
 */
export async function pageChunk(store: Store, b: BatchDoc, chunkIndex: number, lines: InputLine[], known: ResultDoc[]): Promise<void> {
  const start = b.chunk_starts[chunkIndex];
  if (start === undefined) return;
  // A chunk whose results this run wrote pages them without asking first (a page stored already is kept).
  if (known.length < lines.length && (await pages(store).findOne({ _id: pageId(b._id, chunkIndex, 0) }, { projection: { _id: 1 } })))
    return; // paged already
  const byLine = new Map(known.map((r) => [r.line, r]));
  for (const r of await resultsOf(
    store,
    b,
    lines.filter((l) => !byLine.has(l.line)).map((l) => l.line),
  ))
    byLine.set(r.line, r);
  const chunkResults = lines.map((l) => byLine.get(l.line));
  if (chunkResults.some((r, i) => r?.line !== start + i)) return; // a line without its result: not finished
  const docs: PageDoc[] = [];
  for (let i = 0; i < chunkResults.length; i += RESULTS_PAGE_LINES) {
    const texts = chunkResults.slice(i, i + RESULTS_PAGE_LINES).map((r) => JSON.stringify(resultLine(r!)));
    if (texts.reduce((n, l) => n + l.length, 0) > MAX_PAGE_BYTES) continue;
    docs.push(await packPage(pageId(b._id, chunkIndex, i / RESULTS_PAGE_LINES), start + i, texts));
  }
  await insertManyNew(pages(store), docs);
}

/** Stored results of some lines, read one by one by `_id` (a bounded number of them). */
async function resultsOf(store: Store, b: BatchRef, lines: number[]): Promise<ResultDoc[]> {
  const { coll, id } = place<StoredResultDoc>(store, b, 'results');
  const found = await Promise.all(lines.map((n) => coll.findOne({ _id: id(seqId(n)) })));
  return found.filter((r): r is StoredResultDoc => r !== null).map(resultFromStored);
}

/**
 * A batch's results in line order after line `after`, at most `limit` of them, each as its result
 * object's JSON text. A finished chunk's are read a page at a time; an unfinished chunk's done
 * lines (its progress document says which) one by one, at most `limit` of them.
 */
export async function* resultTexts(
  store: Store,
  b: BatchDoc,
  opts: { after?: number; limit?: number } = {},
  cache?: PageCache,
): AsyncGenerator<{ line: number; text: string }> {
  let left = opts.limit ?? Infinity;
  let next = Math.max(0, (opts.after ?? -1) + 1);
  let done = null as { chunk: number; lines: Set<number> } | null;
  /** Pages read ahead of need, and every page id of the batch in line order (once one is read). */
  const ahead = new Map<string, ResultPage>();
  let order: string[] | undefined;
  while (next < b.total && left > 0) {
    const at = locate(b.chunk_starts, b.total, next);
    const id = pageId(b._id, at.chunk, at.page);
    let page = ahead.get(id) ?? cache?.get(id);
    if (!page) {
      // This page and the next few (as many as `limit` still wants) in one read: a read costs FerretDB
      // ~0.5 ms beside what it returns, and a page it does not find (an unfinished chunk's) nothing.
      order ??= pageIds(b);
      const from = order.indexOf(id);
      const want = order
        .slice(from, from + Math.min(READ_AHEAD_PAGES, Math.ceil(left / RESULTS_PAGE_LINES) + 1))
        .filter((p) => p === id || !cache?.get(p)); // kept pages are not read again
      for (const stored of await pages(store)
        .find({ _id: { $in: want } })
        .toArray()) {
        const read = await unpackPage(stored);
        ahead.set(read._id, read);
        cache?.add(read);
      }
      page = ahead.get(id);
    }
    ahead.delete(id);
    if (page) {
      for (let i = next - page.first; i < page.lines.length && left > 0; i++, left--) yield { line: page.first + i, text: page.lines[i] };
      next = at.end;
      continue;
    }
    if (done?.chunk !== at.chunk) {
      const saved = await readProgress(store, b, at.chunk);
      done = { chunk: at.chunk, lines: new Set(saved?.done ?? []) };
    }
    if (!done.lines.size) {
      next = at.chunkEnd; // nothing of this chunk is done yet
      continue;
    }
    const want: number[] = [];
    for (let n = next; n < at.end && want.length < left; n++) if (done.lines.has(n)) want.push(n);
    for (const r of await resultsOf(store, b, want)) {
      yield { line: r.line, text: JSON.stringify(resultLine(r)) };
      left--;
    }
    next = at.end;
  }
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
