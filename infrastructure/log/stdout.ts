// Where JSON log lines go: stdout, with at most LOG_BUFFER_BYTES of them waiting in memory.
// A reader that stops reading (a log driver that is behind, a full disk under it, `| less` paused)
// must neither take the process's memory nor hold its exit. pino's own stdout destination keeps
// every line until it is written, writing from libuv's thread pool; a write to a pipe nobody reads
// holds that thread in write(2), and Node's exit waits for the thread pool, so the process never
// exits. Here lines go through Node's own stdout stream (a pipe is written without blocking, and
// what it cannot take waits in the stream), past the bound they are dropped and counted (the count
// is logged once stdout has taken everything before it), and the lines of one event-loop turn leave
// together, in writes a pipe takes whole. At exit, what a reader far behind has not taken yet is
// lost with the process. A regular file is written synchronously, as Node writes one.
import type pino from 'pino';

export interface StdoutLines extends pino.DestinationStream {
  /** Called with the number of lines dropped, once stdout takes lines again (the first caller's). */
  onResumed(report: (droppedLines: number) => void): void;
}

let shared: StdoutLines | undefined;
let droppedTotal = 0;

/** Lines this process has dropped since it started, for `gateway_log_lines_dropped_total`. */
export const logLinesDropped = (): number => droppedTotal;

/** The process's one stdout destination: the first caller's bound applies to every logger after. */
export function stdoutLines(bufferBytes: number): StdoutLines {
  shared ??= boundedLines(process.stdout, bufferBytes);
  return shared;
}

/**
 * The most characters one write holds: at most 4,095 bytes (a character of a JS string is at most 3
 * bytes of UTF-8), within Linux's PIPE_BUF (4,096), so the kernel puts a write to a pipe there whole
 * or not at all. Several processes share one stdout (the cluster, the supervisor, `2>&1`): a longer
 * write that a full pipe took in part had another process's line written into the middle of it.
 */
const ATOMIC_CHARS = 1_365;

/** `text` (whole lines) as writes of at most ATOMIC_CHARS of whole lines; a longer line is a write of its own. */
function* atomicPieces(text: string): Generator<string> {
  for (let at = 0; at < text.length;) {
    if (text.length - at <= ATOMIC_CHARS) {
      yield text.slice(at);
      return;
    }
    let end = text.lastIndexOf('\n', at + ATOMIC_CHARS - 1);
    if (end < at) end = text.indexOf('\n', at + ATOMIC_CHARS);
    if (end < 0) end = text.length - 1;
    yield text.slice(at, end + 1);
    at = end + 1;
  }
}

/**
 * Lines to `out`, at most `bufferBytes` of them waiting (in this turn's batch, in writes not yet
 * made, or in the stream). The lines of one event-loop turn leave together, in writes of whole lines
 * that a pipe takes whole (atomicPieces), one at a time: the next only once the last is taken.
 */
export function boundedLines(out: NodeJS.WritableStream & { writableLength: number }, bufferBytes: number): StdoutLines {
  let batch = '';
  let scheduled = false;
  const pending: string[] = [];
  let pendingChars = 0;
  let writing = false;
  let dropped = 0;
  let gone = false;
  let report: ((droppedLines: number) => void) | undefined;

  const resumed = () => {
    if (dropped === 0 || writing || pending.length || out.writableLength > 0) return;
    const lines = dropped;
    dropped = 0;
    report?.(lines);
  };
  const pump = () => {
    if (writing || gone) return;
    const next = pending.shift();
    if (next === undefined) return resumed();
    pendingChars -= next.length;
    writing = true;
    out.write(next, (err?: Error | null) => {
      writing = false;
      if ((err as NodeJS.ErrnoException | null | undefined)?.code === 'EPIPE') gone = true;
      pump();
    });
  };
  const flush = () => {
    scheduled = false;
    if (!batch || gone) return;
    for (const piece of atomicPieces(batch)) pending.push(piece);
    pendingChars += batch.length;
    batch = '';
    pump();
  };
  out.on('drain', resumed);
  out.on('error', (err: NodeJS.ErrnoException) => {
    // EPIPE: the reader is gone for good; any other error loses the lines of that write.
    if (err.code === 'EPIPE') gone = true;
  });
  // What was logged before an exit and not written yet (a pipe takes what it can without blocking).
  process.on('exit', () => {
    if (gone) return;
    for (const piece of [...pending, ...atomicPieces(batch)]) out.write(piece);
  });

  return {
    write(line: string) {
      if (gone) return;
      if (batch.length + line.length + pendingChars + out.writableLength > bufferBytes) {
        dropped++;
        droppedTotal++;
        return;
      }
      batch += line;
      if (scheduled) return;
      scheduled = true;
      setImmediate(flush);
    },
    onResumed(fn) {
      report ??= fn;
    },
  };
}
