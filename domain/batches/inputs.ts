// A batch's request lines, stored in chunks of consecutive lines (`batch_inputs`).
import type { Document } from 'mongodb';
import { insertManyNew, type Store } from '../../infrastructure/store';
import { bodyBytes, lineCount, unpackLines, type PackedLines } from './packed-lines';
import { place, seqId } from './placement';
import type { BatchDoc, BatchRef } from './store';

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

/** The largest line body: a chunk of one line stays well under MongoDB's 16 MB document limit. */
export const MAX_LINE_BYTES = 8 * 1024 * 1024;

/**
 * A chunk holds at most this many bytes of bodies, unless it is one larger line. The driver
 * serialises each insert whole on the thread that makes it (UTF-8 twice, then three copies): chunks
 * of 2.2 MB held the API's event loop 60-75 ms each here, with FerretDB taking the last insert on the
 * other core, and over 200 ms on a slower machine. Chunk sizes are written down at creation, so
 * older batches keep theirs.
 */
const CHUNK_BYTES = 1024 * 1024;

export function lineBody(l: InputLine): Record<string, unknown> {
  return JSON.parse(l.body);
}

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

/** Where each chunk of the lines starts: at most `chunkSize` lines and CHUNK_BYTES of bodies each. */
function chunkStarts(lines: PackedLines, chunkSize: number): number[] {
  const starts: number[] = [];
  let count = 0;
  let bytes = 0;
  for (let i = 0; i < lineCount(lines); i++) {
    const size = bodyBytes(lines, i);
    if (!count || count >= chunkSize || bytes + size > CHUNK_BYTES) {
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
 * An insert of input chunks carries at most CHUNK_BYTES of bodies (one larger chunk alone), or 20
 * chunks (of short lines): the driver serialises an insert in one piece. Bodies become text only as
 * their insert is made.
 */
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
      if (group.length && bytes + size > CHUNK_BYTES) break;
      bytes += size;
      const ls = unpackLines(lines, starts[c], end(c));
      group.push({ _id: id(seqId(c)), first: starts[c], custom_ids: ls.map((l) => l.custom_id), bodies: ls.map((l) => l.body) });
    }
    // The driver splits an insert into messages under the server's size limit.
    await insertManyNew(coll, group);
  }
  return starts;
}

/** How many chunks `storeBatchLines` stores the lines in. */
export function batchChunks(lines: PackedLines, chunkSize: number): number {
  return chunkStarts(lines, chunkSize).length;
}
