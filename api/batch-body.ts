// Batch create bodies, received to disk when large and read off the event loop. A body may be up to
// BATCH_MAX_BYTES (200 MB):
// - it may arrive as slowly as its client sends it, so what it holds meanwhile is a file
//   (api/body-spool.ts) and a share of this process's room for large bodies: one workspace's slow
//   uploads cannot keep another's out;
// - decoding, parsing, checking and serialising again 50,000 lines of 3.5 KB held the API process's
//   one thread for 1.5 s, during which every other request of the process waited. So a body above
//   OFF_THREAD_BYTES (or a compressed one) is read on a worker thread, which answers with the lines
//   packed in one buffer, moved rather than copied (domain/batches/packed-lines.ts); a smaller one
//   is read in place;
// - storing the lines is serialising them again (the driver serialises an insert whole, on the
//   thread that makes it: a 1 MB chunk held the event loop ~20-50 ms, a line of 8 MB 170-330 ms),
//   so the lines of a body read on the worker are moved back to it and stored from there.
import fs from 'node:fs';
import path from 'node:path';
import { Worker } from 'node:worker_threads';
import type Koa from 'koa';
import { CreateBatchBody } from '../domain/batches/schema';
import { readBatchLines, type ReadBatch } from '../domain/batches/create';
import { storeInputs } from '../domain/batches/inputs';
import type { PackedLines } from '../domain/batches/packed-lines';
import type { BatchRef } from '../domain/batches/store';
import type { Store } from '../infrastructure/store';
import { errorFromStatus, RateLimitedError, ServiceUnavailableError, type ErrorMetadata } from '../infrastructure/errors';
import { SharedBytes } from '../infrastructure/concurrency/shared-bytes';
import { sizeText } from '../infrastructure/errors/sizes';
import { compileBody } from '../infrastructure/validation/index';
import { bodyEncoding, closeUnread, mostBodyBytes, parseJsonBytes, readBody } from './body';
import { SpooledBody, spoolDirectory } from './body-spool';
import type { BodyMemory } from './body-memory';
import { withinMs } from '../infrastructure/concurrency/within-ms';

export interface BatchBodyLimits {
  /** BODY_MAX_DEPTH. */
  maxDepth: number;
  /** BATCH_MAX_REQUESTS. */
  maxRequests: number;
  /** BATCH_MAX_BYTES: the most a body may be, decoded (and as sent). */
  maxBytes: number;
}

export interface BatchBodySettings extends BatchBodyLimits {
  /** BODY_IDLE_TIMEOUT_MS. */
  idleMs: number;
  /** The database the worker stores the lines of the bodies it read in; without it, they are stored in place. */
  database?: BatchBodyDatabase;
}

/** The API's own database, as the worker thread connects to it. */
interface BatchBodyDatabase {
  uri: string;
  name: string;
}

/** What the worker thread is started with. */
export type WorkerSettings = BatchBodyLimits & { database?: BatchBodyDatabase };

/**
 * Bodies up to this size are kept in memory and read in place: 1 MB holds the event loop 8 ms
 * (lines of 3.5 KB) to ~30 ms (6,000 lines of 170 bytes), and the worker's copies and messages cost a
 * body ~30% more.
 */
const OFF_THREAD_BYTES = 1024 * 1024;
/** How long a closing reader waits for its worker to finish what it was sent (a store of a large batch takes seconds). */
const CLOSE_GRACE_MS = 30_000;

/**
 * Large bodies being received or read, in BATCH_MAX_BYTES: what this process's disk holds for them
 * at most. One workspace holds at most three quarters of it (`ownerShare`), so the others always have
 * room for a body of the largest size, however many one workspace sends and however slowly.
 */
const SPOOLED_BODIES = 4;

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

/**
 * A body goes to the worker as its file, or (a small compressed one) as its bytes; lines it read
 * come back to be stored. The worker answers each message once.
 */
export type ToWorker =
  | ({ id: number } & (
      | { encoding: string; file: string }
      | { encoding: string; bytes: Uint8Array }
      | { store: { batch: BatchRef; lines: PackedLines; chunkSize: number } }
    ))
  /** Finish what was sent, close the database connection and end the thread. */
  | { close: true };
/**
 * `read`: a body's lines; `starts`: the lines stored, each chunk's first line. `crash`: anything but
 * a refusal (a defect), as its stack, so that it is logged as the error it was.
 */
export type WorkerAnswer =
  { id: number; read: ReadBatch } | { id: number; starts: number[] } | { id: number; error: ReadFailure } | { id: number; crash: string };

interface Waiting {
  resolve: (answer: ReadBatch | number[]) => void;
  reject: (err: unknown) => void;
}

/**
 * Memory for reading large bodies: up to a budget of bytes at once, one body always, in the order
 * they finished arriving. Reading a body takes several times its size in memory for a while (one 179
 * MB batch took the process from 0.2 to 1.4 GB, six at once to 4.2 GB). A body waits here only for
 * the reads and stores ahead of it, never for a client.
 */
export class ReadTurns {
  private used = 0;
  private readonly queue: { bytes: number; go: () => void }[] = [];

  constructor(private readonly budget: number) {}

  private fits(bytes: number): boolean {
    return this.used === 0 || this.used + bytes <= this.budget;
  }

  async take(bytes: number): Promise<() => void> {
    if (this.queue.length || !this.fits(bytes)) await new Promise<void>((go) => this.queue.push({ bytes, go }));
    else this.used += bytes;
    let done = false;
    return () => {
      if (done) return;
      done = true;
      this.used -= bytes;
      while (this.queue.length && this.fits(this.queue[0].bytes)) {
        const next = this.queue.shift()!;
        this.used += next.bytes;
        next.go();
      }
    };
  }
}

/**
 * Receives and reads batch create bodies; one worker thread (started by `warm`, or by the first large
 * body) reads the large ones in turn.
 */
export class BatchBodyReader {
  private worker: Worker | null = null;
  private readonly waiting = new Map<number, Waiting>();
  private next = 0;
  /** Made by `warm` or the first body (again after `close`). */
  private dir: string | null = null;
  /** Bytes of large bodies being received or read (as declared, or the limit when sent chunked), by workspace. */
  private readonly spooled: SharedBytes;
  private readonly turns: ReadTurns;

  constructor(
    private readonly settings: BatchBodySettings,
    private readonly offThreadBytes = OFF_THREAD_BYTES,
  ) {
    this.turns = new ReadTurns(settings.maxBytes);
    this.spooled = new SharedBytes(SPOOLED_BODIES * settings.maxBytes, {
      owner: (held, share) =>
        new RateLimitedError(
          `This workspace is sending other large batches to this process (${sizeText(held)} of the ${sizeText(share)} one workspace may send at once); retry once they are read`,
          5,
        ),
      all: () => new RateLimitedError('This process is receiving other large batches right now; retry in a few seconds', 5),
    });
  }

  /** Bytes of large bodies being received or read now (as counted against the room for them). */
  get spooledBytes(): number {
    return this.spooled.heldBytes;
  }

  /**
   * Receives a request's batch body for a workspace and reads it; `use` runs with the lines read,
   * while the memory they take is still counted. Refused with a 429 before the body is read when the
   * workspace (or the process) holds its share of large bodies already.
   */
  async receive<T>(ctx: Koa.Context, workspaceId: string, memory: BodyMemory, use: (read: ReadBatch) => Promise<T>): Promise<T> {
    const { maxBytes, maxDepth, idleMs } = this.settings;
    let body: SpooledBody | null = null;
    let unreserve = () => {};
    try {
      const encoding = bodyEncoding(ctx.req);
      const most = mostBodyBytes(ctx.req, maxBytes);
      unreserve = this.reserve(workspaceId, most);
      body = this.spool(encoding);
      // A body that stays in memory counts there; a larger one was reserved room on disk above.
      const hold = most <= this.offThreadBytes ? { memory, workspaceId } : undefined;
      await readBody(ctx.req, { limitBytes: maxBytes, maxDepth, idleMs }, body, hold);
    } catch (err) {
      closeUnread(ctx);
      unreserve();
      body?.discard();
      throw err;
    }
    let endTurn = () => {};
    try {
      // Small and sent as is: read in place. Else it waits its turn for the memory to read it: its
      // size, or the limit for a compressed body (which may decode to that).
      if (!body.readableInPlace) endTurn = await this.turns.take(body.encoding === 'identity' ? body.bytes : maxBytes);
      return await use(await this.read(body));
    } finally {
      endTurn();
      unreserve();
      body.discard();
    }
  }

  /** Holds `bytes` of the spool for a workspace's body, or refuses it; the function returned gives them back. */
  reserve(workspaceId: string, bytes: number): () => void {
    if (bytes <= this.offThreadBytes) return () => undefined;
    this.spooled.add(workspaceId, bytes);
    let done = false;
    return () => {
      if (!done) this.spooled.release(workspaceId, bytes);
      done = true;
    };
  }

  /** A new body, kept in this reader's directory once large. */
  spool(encoding = 'identity'): SpooledBody {
    this.dir ??= spoolDirectory();
    return new SpooledBody(this.dir, `${this.next++}.body`, this.offThreadBytes, encoding);
  }

  /** Starts the worker and makes the directory now, off any request's path: the worker takes ~0.3 s to load. */
  warm(): void {
    this.started();
    this.dir ??= spoolDirectory();
  }

  private readInPlace(body: SpooledBody): ReadBatch {
    const { chunks } = body;
    return readBatchBody(chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, body.bytes), this.settings);
  }

  /** Reads a body that has arrived in full: in place when small and sent as is, else on the worker. */
  async read(body: SpooledBody): Promise<ReadBatch> {
    if (body.readableInPlace) return this.readInPlace(body);
    if (body.file) return this.ask<ReadBatch>({ id: this.next++, encoding: body.encoding, file: body.file });
    // A small compressed body: copied into memory of its own and moved (never from Buffer's shared
    // pool, which moving would take from everyone).
    const bytes = new Uint8Array(body.bytes);
    for (let k = 0, at = 0; k < body.chunks.length; at += body.chunks[k].byteLength, k++) bytes.set(body.chunks[k], at);
    return this.ask<ReadBatch>({ id: this.next++, encoding: body.encoding, bytes }, [bytes.buffer]);
  }

  /**
   * Stores a new batch's input lines (domain/batches/inputs.ts): more than OFF_THREAD_BYTES of
   * bodies on the worker, when it has the database, else in place. The bodies are moved to the
   * worker: `lines.bodies` is empty here afterwards (their sizes stay in `lines.ends`).
   */
  writeInputs(store: Store, batch: BatchRef, lines: PackedLines, chunkSize: number): Promise<number[]> {
    if (!this.settings.database || lines.bodies.byteLength <= this.offThreadBytes) return storeInputs(store, batch, lines, chunkSize);
    // Packed lines' bodies are memory of their own (packLines), so moving them takes nothing else.
    return this.ask<number[]>({ id: this.next++, store: { batch: { _id: batch._id }, lines, chunkSize } }, [
      lines.bodies.buffer as ArrayBuffer,
    ]);
  }

  private ask<T extends ReadBatch | number[]>(message: ToWorker & { id: number }, transfer: ArrayBuffer[] = []): Promise<T> {
    const answered = new Promise<T>((resolve, reject) =>
      this.waiting.set(message.id, { resolve: resolve as (answer: ReadBatch | number[]) => void, reject }),
    );
    this.started().postMessage(message, transfer);
    return answered;
  }

  private started(): Worker {
    if (this.worker) return this.worker;
    const { maxDepth, maxRequests, maxBytes, database } = this.settings;
    const worker = new Worker(path.join(__dirname, 'batch-body-worker.js'), {
      workerData: { maxDepth, maxRequests, maxBytes, database } satisfies WorkerSettings,
    });
    worker.unref(); // an idle reader never keeps the process alive
    worker.on('message', (answer: WorkerAnswer) => {
      const w = this.waiting.get(answer.id);
      this.waiting.delete(answer.id);
      if (!w) return;
      if ('read' in answer) w.resolve(answer.read);
      else if ('starts' in answer) w.resolve(answer.starts);
      else if ('error' in answer) w.reject(errorFromStatus(answer.error.status, answer.error.message, answer.error.metadata));
      else w.reject(new Error(`batch body worker: ${answer.crash}`));
    });
    // A worker that died (out of memory, say) fails what it held; the next large body starts another.
    const lost = () => {
      if (this.worker === worker) this.worker = null;
      for (const w of this.waiting.values())
        w.reject(new ServiceUnavailableError('The batch could not be read or stored right now; try again'));
      this.waiting.clear();
    };
    worker.on('error', lost);
    worker.on('exit', lost);
    this.worker = worker;
    return worker;
  }

  /**
   * Ends the worker once it has finished what it was sent: asked to, not terminated. A thread
   * terminated mid-work aborted its whole process now and then (Node 20: a zlib stream of a page
   * being stored closed before its init; a background compile for the isolate being torn down).
   * Terminated only if it has not ended after CLOSE_GRACE_MS.
   */
  async close(): Promise<void> {
    const worker = this.worker;
    this.worker = null;
    if (worker) {
      const ended = new Promise<boolean>((resolve) => worker.once('exit', () => resolve(true)));
      worker.postMessage({ close: true } satisfies ToWorker);
      if (!(await withinMs(ended, CLOSE_GRACE_MS, false))) await worker.terminate();
    }
    if (this.dir) fs.rmSync(this.dir, { recursive: true, force: true });
    this.dir = null;
  }
}
