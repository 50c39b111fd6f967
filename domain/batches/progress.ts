// Each chunk's progress (`batch_progress`): one small document per chunk, written only by that
// chunk's activity, with its tally and the lines whose results are stored. Live counts, the close
// and a retried chunk read it.
import type { Document } from 'mongodb';
import type { Store } from '../../infrastructure/store';
import { fromJsonText, toJsonText } from '../../infrastructure/store/json-text';
import { local, place, seqId } from './placement';
import type { ResultDoc } from './results';
import type { BatchDoc, BatchRef } from './store';

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
