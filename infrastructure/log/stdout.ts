// Where JSON log lines go: stdout, with at most LOG_BUFFER_BYTES of them waiting in memory.
// A reader that stops reading (a log driver that is behind, a full disk under it, `| less` paused)
// must neither take the process's memory nor hold its exit. pino's own stdout destination keeps
// every line until it is written, writing from libuv's thread pool; a write to a pipe nobody reads
// holds that thread in write(2), and Node's exit waits for the thread pool, so the process never
// exits. Here lines go through Node's own stdout stream (a pipe is written without blocking, and
// what it cannot take waits in the stream), past the bound they are dropped and counted (the count
// is logged once stdout has taken everything before it), and the lines of one event-loop turn leave
// in one write. At exit, what a reader far behind has not taken yet is lost with the process. A
// regular file is written synchronously, as Node writes one.
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

/** Lines to `out`, at most `bufferBytes` of them waiting (in this turn's batch or in the stream). */
export function boundedLines(out: NodeJS.WritableStream & { writableLength: number }, bufferBytes: number): StdoutLines {
  let batch = '';
  let scheduled = false;
  let dropped = 0;
  let gone = false;
  let report: ((droppedLines: number) => void) | undefined;

  const flush = () => {
    scheduled = false;
    if (!batch || gone) return;
    const lines = batch;
    batch = '';
    out.write(lines);
  };
  const resumed = () => {
    if (dropped === 0 || out.writableLength > 0) return;
    const lines = dropped;
    dropped = 0;
    report?.(lines);
  };
  out.on('drain', resumed);
  out.on('error', (err: NodeJS.ErrnoException) => {
    // EPIPE: the reader is gone for good; any other error loses the lines of that write.
    if (err.code === 'EPIPE') gone = true;
  });
  // What this turn logged before an exit (a pipe takes what it can without blocking).
  process.on('exit', flush);

  return {
    write(line: string) {
      if (gone) return;
      if (batch.length + line.length + out.writableLength > bufferBytes) {
        dropped++;
        droppedTotal++;
        return;
      }
      batch += line;
      if (scheduled) return;
      scheduled = true;
      setImmediate(() => {
        flush();
        resumed();
      });
    },
    onResumed(fn) {
      report ??= fn;
    },
  };
}
