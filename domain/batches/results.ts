// A batch's results: one document per line holding its JSON text (`batch_results`), written once:
// the first write of a line wins. Once a chunk is finished its results are also stored as pages of
// RESULTS_PAGE_LINES lines (`batch_pages`), which is what readers read: any page of results costs
// one or two reads by `_id`, whatever the batch's size.
import type { Collection, Document } from 'mongodb';
import { insertManyNew, type Store } from '../../infrastructure/store';
import type { InputLine } from './inputs';
import { packPage, unpackPage, type PageDoc, type ResultPage } from './page-form';
import type { PageCache } from './page-cache';
import { local, place, seqId } from './placement';
import { readProgress } from './progress';
import type { BatchDoc, BatchRef } from './store';
import { withFields } from '../../infrastructure/objects/with-fields';

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
  return local(typeof doc.text === 'string' ? (withFields(JSON.parse(doc.text), { _id: doc._id }) as ResultDoc) : (doc as ResultDoc));
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

function resultLine(r: ResultDoc) {
  return { id: r.id, custom_id: r.custom_id, response: r.response, error: r.error };
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
export function pageIds(b: Pick<BatchDoc, '_id' | 'chunk_starts' | 'total'>): string[] {
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
