// Batch create bodies, read off the event loop when large. A body may be up to BATCH_MAX_BYTES
// (200 MB): decoding, parsing, checking and serialising again 50,000 lines of 3.5 KB held the API
// process's one thread for 1.5 s, and every other request of the process waited. A body above
// OFF_THREAD_BYTES is read on a worker thread, which answers with the lines packed in one buffer,
// moved rather than copied (domain/batches/packed-lines.ts); a smaller one is read in place.
import path from 'node:path';
import { Worker } from 'node:worker_threads';
import { CreateBatchBody } from '../domain/batches/schema';
import { readBatchLines, type ReadBatch } from '../domain/batches/create';
import { errorFromStatus, RateLimitedError, ServiceUnavailableError, type ErrorMetadata } from '../infrastructure/errors';
import { compileBody } from '../infrastructure/validation/index';
import { parseJsonBytes } from './body';

export interface BatchBodyLimits {
  /** BODY_MAX_DEPTH. */
  maxDepth: number;
  /** BATCH_MAX_REQUESTS. */
  maxRequests: number;
}

/**
 * Bodies up to this size are read in place: 1 MB holds the event loop 8 ms (lines of 3.5 KB) to
 * ~30 ms (6,000 lines of 170 bytes), and the worker's copies and messages cost a body ~30% more.
 */
const OFF_THREAD_BYTES = 1024 * 1024;

const createBody = compileBody(CreateBatchBody);

/** Reads a batch create body: JSON (strictly), its shape, then its lines. What the worker thread runs. */
export function readBatchBody(raw: Uint8Array, limits: BatchBodyLimits): ReadBatch {
  return readBatchLines(createBody(parseJsonBytes(raw, limits.maxDepth)), limits.maxRequests);
}

/** A refusal, as it crosses back from the worker. */
interface ReadFailure {
  status: number;
  message: string;
  metadata: ErrorMetadata | null;
}

/** A body goes to the worker in pieces, then its end; the worker answers once per body. */
export type ToWorker = { id: number; piece: Uint8Array } | { id: number; end: true };
/** `crash`: anything but a refusal (a defect), as its stack, so that it is logged as the error it was. */
export type WorkerAnswer = { id: number; read: ReadBatch } | { id: number; error: ReadFailure } | { id: number; crash: string };

interface Waiting {
  resolve: (read: ReadBatch) => void;
  reject: (err: unknown) => void;
}

/** What the worker is sent at a time, so that the event loop is given back between pieces. */
const PIECE_BYTES = 4 * 1024 * 1024;

/**
 * Reads batch create bodies; one worker thread (started by `warm`, or by the first large body)
 * serves them in turn. Large bodies are admitted up to BATCH_MAX_BYTES at once: reading one takes
 * several times its size in memory for a while (one 179 MB batch took the process from 0.2 to
 * 1.4 GB, six at once to 4.2 GB).
 */
export class BatchBodyReader {
  private worker: Worker | null = null;
  private readonly waiting = new Map<number, Waiting>();
  private next = 0;
  /** Bytes of large bodies admitted and not yet done with. */
  private admitted = 0;

  constructor(
    private readonly limits: BatchBodyLimits & {
      /** BATCH_MAX_BYTES: the most bytes of large bodies this process reads at once (one such body is always admitted). */
      maxBytes: number;
    },
    private readonly offThreadBytes = OFF_THREAD_BYTES,
  ) {}

  /**
   * Admits a body of `bytes` (at most, when its size is not known in advance) before it is read, or
   * refuses it with a 429 while others hold the budget; the function returned ends the admission.
   */
  admit(bytes: number): () => void {
    if (bytes <= this.offThreadBytes) return () => undefined;
    if (this.admitted > 0 && this.admitted + bytes > this.limits.maxBytes) {
      throw new RateLimitedError('This process is reading other large batches right now; retry in a few seconds', 5);
    }
    this.admitted += bytes;
    let done = false;
    return () => {
      if (!done) this.admitted -= bytes;
      done = true;
    };
  }

  /** Starts the worker now, off any request's path: it takes ~0.3 s to load, which the first large body would wait for. */
  warm(): void {
    this.started();
  }

  /** Reads a body given in the pieces it arrived in. */
  async read(chunks: Buffer[]): Promise<ReadBatch> {
    const size = chunks.reduce((n, c) => n + c.byteLength, 0);
    if (size <= this.offThreadBytes) return readBatchBody(chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, size), this.limits);
    const id = this.next++;
    const answered = new Promise<ReadBatch>((resolve, reject) => this.waiting.set(id, { resolve, reject }));
    answered.catch(() => undefined); // it may fail while the pieces are still being sent: not unhandled
    // One worker for the whole body: if it dies meanwhile, the rest goes nowhere and the read fails (503).
    const worker = this.started();
    // Copied a few MB at a time into memory of its own (~1 ms each), then moved: never the whole
    // body at once (179 MB: 144 ms). Posting the pieces as they are would copy each one's whole
    // backing memory, which they may share with each other or with Node's.
    for (let i = 0; i < chunks.length;) {
      const from = i;
      let bytes = 0;
      for (; i < chunks.length && bytes < PIECE_BYTES; i++) bytes += chunks[i].byteLength;
      const piece = new Uint8Array(bytes); // never from Buffer's shared pool, which moving would take from everyone
      for (let k = from, at = 0; k < i; at += chunks[k].byteLength, k++) piece.set(chunks[k], at);
      worker.postMessage({ id, piece } satisfies ToWorker, [piece.buffer]);
      if (i < chunks.length) await new Promise((resolve) => setImmediate(resolve));
    }
    worker.postMessage({ id, end: true } satisfies ToWorker);
    return answered;
  }

  private started(): Worker {
    if (this.worker) return this.worker;
    const worker = new Worker(path.join(__dirname, 'batch-body-worker.js'), { workerData: this.limits });
    worker.unref(); // an idle reader never keeps the process alive
    worker.on('message', (answer: WorkerAnswer) => {
      const w = this.waiting.get(answer.id);
      this.waiting.delete(answer.id);
      if (!w) return;
      if ('read' in answer) w.resolve(answer.read);
      else if ('error' in answer) w.reject(errorFromStatus(answer.error.status, answer.error.message, answer.error.metadata));
      else w.reject(new Error(`batch body worker: ${answer.crash}`));
    });
    // A worker that died (out of memory, say) fails what it held; the next large body starts another.
    const lost = () => {
      if (this.worker === worker) this.worker = null;
      for (const w of this.waiting.values()) w.reject(new ServiceUnavailableError('The batch could not be read right now; try again'));
      this.waiting.clear();
    };
    worker.on('error', lost);
    worker.on('exit', lost);
    this.worker = worker;
    return worker;
  }

  async close(): Promise<void> {
    const worker = this.worker;
    this.worker = null;
    await worker?.terminate();
  }
}
