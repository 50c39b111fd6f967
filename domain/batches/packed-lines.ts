// A new batch's request lines in the form they cross threads in: a large batch is read on a worker
// thread (api/batch-body.ts), and what comes back must not cost the event loop what reading it
// would. Strings are copied one by one between threads (50,000 lines of 3.5 KB held the event loop
// for 370 ms); one buffer of every body's JSON text is moved whole (14 ms). Bodies become strings
// again a group of chunks at a time, as they are stored.
import type { InputLine } from './inputs';

export interface PackedLines {
  customIds: string[];
  /** Every line's body as JSON text, UTF-8, one after another. */
  bodies: Uint8Array;
  /** Where each body ends in `bodies` (body i starts where body i - 1 ends). */
  ends: Uint32Array;
}

/** Packs lines whose bodies are JSON text already. */
export function packLines(lines: { custom_id: string; body: string }[]): PackedLines {
  let total = 0;
  for (const l of lines) total += Buffer.byteLength(l.body);
  const bodies = Buffer.allocUnsafeSlow(total); // its own memory, so it can be moved to another thread
  const ends = new Uint32Array(lines.length);
  let at = 0;
  lines.forEach((l, i) => {
    at += bodies.write(l.body, at);
    ends[i] = at;
  });
  return { customIds: lines.map((l) => l.custom_id), bodies, ends };
}

export const lineCount = (p: PackedLines): number => p.customIds.length;

const startOf = (p: PackedLines, i: number): number => (i === 0 ? 0 : p.ends[i - 1]);

/** The size in bytes of the bodies of lines `from` to `to` (excluded). */
export const bodyBytes = (p: PackedLines, from: number, to = from + 1): number => startOf(p, to) - startOf(p, from);

/** What storing the lines takes: their bodies and custom ids, as counted against a workspace's storage quota. */
export const storedSize = (p: PackedLines): number => p.bodies.byteLength + p.customIds.reduce((n, id) => n + Buffer.byteLength(id), 0);

/** Lines `from` to `to` (excluded), their bodies as text. */
export function unpackLines(p: PackedLines, from: number, to: number): InputLine[] {
  const bytes = Buffer.from(p.bodies.buffer, p.bodies.byteOffset, p.bodies.byteLength);
  const out: InputLine[] = [];
  for (let i = from; i < to; i++) out.push({ line: i, custom_id: p.customIds[i], body: bytes.toString('utf8', startOf(p, i), p.ends[i]) });
  return out;
}
