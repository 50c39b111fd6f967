// JSON request bodies, read by hand because every step has a limit a hostile client tests:
// only application/json; identity, gzip, deflate or br encoding; a body that stalls is refused
// rather than held open; strict UTF-8; no `__proto__` keys; bounded nesting. A compressed body is
// kept as sent until it has arrived in full, then inflated no further than the size limit: inflated
// as it arrived, a few KB of gzip held 9 MB of memory for as long as its client trickled the rest
// (200 such requests: 2 GB). A refusal before the body was read in full closes the connection.
import zlib from 'node:zlib';
import { promisify } from 'node:util';
import type Koa from 'koa';
import bourne from '@hapi/bourne';
import type { BodyMemory } from './body-memory';
import { dropUnread } from './lingering-close';
import { BadRequestError, PayloadTooLargeError, RequestTimeoutError, type GatewayError } from '../infrastructure/errors';
import { nextTurn, TURN_SPLIT_BYTES } from '../infrastructure/concurrency/next-turn';
import { parseInTurns, ShapeError, utf8Pieces } from '../infrastructure/concurrency/json-in-turns';

export interface BodyLimits {
  /** Bytes as sent, and decoded. */
  limitBytes: number;
  /** Objects and arrays nested deeper than this are refused. */
  maxDepth: number;
  /** A body that sends nothing for this long is refused with 408. */
  idleMs: number;
}

type Inflate = (raw: Uint8Array, opts: zlib.ZlibOptions) => Buffer;
type InflateAsync = (raw: Uint8Array, opts: zlib.ZlibOptions) => Promise<Buffer>;

/** The encodings we read: identity, or how to inflate (at once, and on the thread pool). */
const DECODERS: Record<string, { now: Inflate; later: InflateAsync } | null> = {
  identity: null,
  gzip: { now: zlib.gunzipSync, later: promisify(zlib.gunzip) },
  'x-gzip': { now: zlib.gunzipSync, later: promisify(zlib.gunzip) },
  deflate: { now: zlib.inflateSync, later: promisify(zlib.inflate) },
  br: { now: zlib.brotliDecompressSync, later: promisify(zlib.brotliDecompress) },
};

function inflateRefusal(err: unknown, encoding: string): GatewayError {
  if ((err as NodeJS.ErrnoException).code === 'ERR_BUFFER_TOO_LARGE')
    return new PayloadTooLargeError('Request body is larger than the configured limit');
  return new BadRequestError(`Request body is not valid ${encoding} data`);
}

/** A body as sent, inflated no further than `limitBytes` (a small bomb stops there, with a 413); on this thread. */
export function inflatedNow(raw: Uint8Array, encoding: string, limitBytes: number): Uint8Array {
  const decoder = DECODERS[encoding];
  if (!decoder) return raw;
  try {
    return decoder.now(raw, { maxOutputLength: limitBytes });
  } catch (err) {
    throw inflateRefusal(err, encoding);
  }
}

/** As `inflatedNow`, on libuv's thread pool rather than the event loop. */
async function inflated(raw: Uint8Array, encoding: string, limitBytes: number): Promise<Uint8Array> {
  try {
    return await DECODERS[encoding]!.later(raw, { maxOutputLength: limitBytes });
  } catch (err) {
    throw inflateRefusal(err, encoding);
  }
}

/**
 * Whether an object or array in JSON text nests deeper than `max` (strings skipped), stopping once
 * past it. A string is skipped by searching for its closing quote (native, ~20× a loop over its
 * characters): a body holding a 9.5 MB string (an image in base64) was scanned in ~20 ms of the
 * event loop, now in ~1.
 */
export function jsonDepthOver(text: string, max: number): boolean {
  let depth = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 34 /* " */) {
      i = closingQuote(text, i + 1);
      if (i < 0) return false; // unterminated: not JSON, which the parser says
    } else if (c === 123 /* { */ || c === 91 /* [ */) {
      if (++depth > max) return true;
    } else if (c === 125 || c === 93) {
      depth--;
    }
  }
  return false;
}

/** Where the string starting at `from` (after its opening quote) ends; -1 if it does not. */
function closingQuote(text: string, from: number): number {
  for (let q = text.indexOf('"', from); q >= 0; q = text.indexOf('"', q + 1)) {
    // Escaped when an odd number of backslashes precede it.
    let slashes = 0;
    while (text.charCodeAt(q - 1 - slashes) === 92 /* \ */) slashes++;
    if (slashes % 2 === 0) return q;
  }
  return -1;
}

/** A body being read, looked at by the one sweep below: refused once it has been quiet for `sweeps` sweeps. */
interface Watched {
  sweeps: number;
  quiet: number;
  /** Something arrived since the last sweep. */
  active: boolean;
  stall: () => void;
}

/**
 * One timer for every body being read, not one armed per chunk: a timer per request was 1% of a
 * proxied call's CPU. A body is refused after `idleMs` of silence, give or take a sweep.
 */
const SWEEP_MS = 250;
const watched = new Set<Watched>();
let sweeper: NodeJS.Timeout | null = null;

function sweep(): void {
  if (!watched.size) {
    clearInterval(sweeper!);
    sweeper = null;
    return;
  }
  for (const w of watched) {
    if (w.active) {
      w.active = false;
      w.quiet = 0;
    } else if (++w.quiet >= w.sweeps) {
      w.stall();
    }
  }
}

function watch(w: Watched): void {
  watched.add(w);
  sweeper ??= setInterval(sweep, SWEEP_MS).unref();
}

const encodingOf = (req: Koa.Request['req']) => (req.headers['content-encoding'] ?? 'identity').trim().toLowerCase();

/** The most bytes a request's body may arrive as: its Content-Length, else the limit. */
export function mostBodyBytes(req: Koa.Request['req'], limitBytes: number): number {
  const declared = Number(req.headers['content-length']);
  return declared > 0 ? Math.min(declared, limitBytes) : limitBytes;
}

/**
 * Where a body's pieces go as they are read: in memory (`InMemory`), or, for a batch, a file once
 * large (api/body-spool.ts).
 */
export interface BodySink {
  /** Keeps a piece; false when reading should pause until `onDrain` calls back. Throws a GatewayError to refuse. */
  take(chunk: Buffer): boolean;
  onDrain(resume: () => void): void;
  /** Everything arrived: resolves once it is all kept (nothing to wait for: undefined). */
  end(): Promise<void> | undefined;
}

/** The pieces as they arrived. */
class InMemory implements BodySink {
  readonly chunks: Buffer[] = [];
  take(chunk: Buffer): boolean {
    this.chunks.push(chunk);
    return true;
  }
  onDrain(): void {}
  end(): undefined {
    return undefined;
  }
}

/** Refuses an encoding we cannot read; the encoding otherwise. */
export function bodyEncoding(req: Koa.Request['req']): string {
  const encoding = encodingOf(req);
  if (!(encoding in DECODERS))
    throw new BadRequestError(
      `Content-Encoding ${JSON.stringify(encoding.slice(0, 40))} is not supported (use identity, gzip, deflate or br)`,
    );
  return encoding;
}

/** Whose body it is, for a body kept in memory: counted against the process's room for them while it arrives. */
export interface MemoryHold {
  memory: BodyMemory;
  workspaceId: string;
}

/**
 * Reads a body, as sent, into `sink`; resolves with its encoding, for whoever reads it to inflate
 * (`inflatedNow`) within the same limit. With `hold`, what is kept in memory meanwhile is counted
 * (and may be refused), until read.
 */
export function readBody(req: Koa.Request['req'], limits: BodyLimits, sink: BodySink, hold?: MemoryHold): Promise<string> {
  const encoding = bodyEncoding(req);
  if (Number(req.headers['content-length']) > limits.limitBytes)
    throw new PayloadTooLargeError('Request body is larger than the configured limit');
  return new Promise<string>((resolve, reject) => {
    let size = 0;
    let settled = false;
    const watching: Watched = {
      sweeps: Math.max(1, Math.ceil(limits.idleMs / SWEEP_MS)),
      quiet: 0,
      active: true,
      stall: () => finish(new RequestTimeoutError(`Request body stalled: nothing received for ${limits.idleMs} ms`)),
    };
    // Settles once; stops reading without destroying the request, whose socket still carries the answer.
    const finish = (err: GatewayError | null) => {
      if (settled) return;
      settled = true;
      watched.delete(watching);
      req.off('data', onData).off('end', onEnd).off('error', lost).off('aborted', lost);
      hold?.memory.release(hold.workspaceId, size);
      if (err) {
        req.pause();
        reject(err);
      } else {
        resolve(encoding);
      }
    };
    const resume = () => {
      watching.active = true;
      if (!settled) req.resume();
    };
    const onData = (chunk: Buffer) => {
      watching.active = true;
      if (size + chunk.length > limits.limitBytes)
        return finish(new PayloadTooLargeError('Request body is larger than the configured limit'));
      try {
        hold?.memory.add(hold.workspaceId, chunk.length);
      } catch (err) {
        return finish(err as GatewayError);
      }
      size += chunk.length; // counted in memory, when held, from here
      try {
        if (!sink.take(chunk)) {
          req.pause();
          sink.onDrain(resume);
        }
      } catch (err) {
        finish(err as GatewayError);
      }
    };
    const onEnd = () => {
      watched.delete(watching); // what is left is ours to write, not the client's to send
      const kept = sink.end();
      if (!kept) return finish(null); // in memory: no turn to wait (the hot path)
      kept.then(
        () => finish(null),
        (err: GatewayError) => finish(err),
      );
    };
    // The client went away mid-body (or sent less than its Content-Length and closed).
    const lost = () => finish(new BadRequestError('Request body was not received in full'));
    req.on('data', onData).on('end', onEnd).on('error', lost).on('aborted', lost);
    watch(watching);
  });
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

/** Text that starts an object or array, after JSON whitespace. */
const OPENS_CONTAINER = /^[\x20\x09\x0a\x0d]*[[{]/;
/** A body's refusals, whichever way it is parsed. */
const notAContainer = () => new BadRequestError('Request body is not valid JSON (expected an object)');
const nestsTooDeep = (maxDepth: number) => new BadRequestError(`Request body nests deeper than ${maxDepth} levels`);
const forbiddenKey = () => new BadRequestError('Request body contains a forbidden key ("__proto__")');
const notJson = () => new BadRequestError('Request body is not valid JSON');
const notUtf8 = () => new BadRequestError('Request body is not valid UTF-8');

/** Parses JSON text as a request body: an object or array, safe keys, bounded depth. */
function parseJsonBody(text: string, maxDepth: number): unknown {
  if (!OPENS_CONTAINER.test(text)) throw notAContainer();
  if (jsonDepthOver(text, maxDepth)) throw nestsTooDeep(maxDepth);
  try {
    return bourne.parse(text, { protoAction: 'error' });
  } catch (err) {
    if (/prototype/.test((err as Error).message)) throw forbiddenKey();
    throw notJson();
  }
}

/**
 * The most members an array or object of a request body may have: far past what a call sends (an
 * embeddings call takes 2,048 inputs, Anthropic 100,000 messages), far under what a 10 MB body
 * could hold (five million numbers, whose array alone held the loop 177 ms to grow).
 */
const BODY_MAX_MEMBERS = 100_000;

/** `parseJsonBody` of a large body, a group of members at a time (infrastructure/concurrency/json-in-turns). */
async function parseJsonBodyInTurns(pieces: string[], maxDepth: number): Promise<unknown> {
  if (!OPENS_CONTAINER.test(pieces.find((p) => /[^\x20\x09\x0a\x0d]/.test(p)) ?? '')) throw notAContainer();
  try {
    return await parseInTurns(pieces, { maxDepth, refuseProtoKeys: true, maxMembers: BODY_MAX_MEMBERS });
  } catch (err) {
    if (!(err instanceof ShapeError)) throw notJson();
    if (err.reason === 'depth') throw nestsTooDeep(maxDepth);
    if (err.reason === 'members')
      throw new BadRequestError(`Request body has an array or object of more than ${BODY_MAX_MEMBERS.toLocaleString('en')} members`);
    throw forbiddenKey();
  }
}

/**
 * Commas past which a large body is parsed in turns (its values counted, at most BODY_MAX_MEMBERS
 * in one array or object); with fewer, one JSON.parse costs little more than the bytes (1.4 MB of
 * 100,000 small objects: 10-20 ms whole, 59-188 ms through the scan, which costs more than
 * JSON.parse on dense text), 4.9 million numbers ~0.5 s.
 */
const MANY_VALUES = 150_000;

/** A body of a megabyte or more: parsed whole in a turn of its own, or in turns when it holds many values. */
async function parseLargeBody(pieces: string[], maxDepth: number): Promise<unknown> {
  let commas = 0;
  for (const piece of pieces) for (let at = piece.indexOf(','); at >= 0 && commas < MANY_VALUES; at = piece.indexOf(',', at + 1)) commas++;
  if (commas >= MANY_VALUES) return await parseJsonBodyInTurns(pieces, maxDepth);
  await nextTurn();
  const text = pieces.length === 1 ? pieces[0] : pieces.join('');
  if (pieces.length > 1) await nextTurn(); // joined in one turn, parsed in the next
  return parseJsonBody(text, maxDepth);
}

/** Chunks as strict UTF-8 text in pieces, decoded in turns. */
async function strictUtf8Pieces(chunks: Buffer[]): Promise<string[]> {
  try {
    return await utf8Pieces(chunks, true);
  } catch (err) {
    if (err instanceof TypeError) throw notUtf8();
    throw err;
  }
}

/** The body as text: strict UTF-8. */
function utf8Text(raw: Uint8Array): string {
  try {
    return utf8.decode(raw);
  } catch {
    throw notUtf8();
  }
}

/** The body as JSON: strict UTF-8, no deeper than `maxDepth`, no `__proto__` key. */
export function parseJsonBytes(raw: Uint8Array, maxDepth: number): unknown {
  return parseJsonBody(utf8Text(raw), maxDepth);
}

/** Counts a workspace's large bodies before they are parsed (api/rate-limit admitBodyBytes). */
export interface BodyBytesAdmission {
  /** Smaller bodies are not counted. */
  minBytes: number;
  admit(workspaceId: string, bytes: number): Promise<void>;
}

/**
 * Reads a JSON body into `ctx.request.body`; with `read: false`, only checks its headers, for a
 * route that reads the body itself (a batch, which may be large: api/batch-body).
 */
export function jsonBody(
  limits: BodyLimits,
  { read = true, memory, bodyBytes }: { read?: boolean; memory?: BodyMemory; bodyBytes?: BodyBytesAdmission } = {},
): Koa.Middleware {
  return async (ctx, next) => {
    const hasBody = Number(ctx.get('content-length') || 0) > 0 || ctx.get('transfer-encoding') !== '';
    try {
      if (!hasBody) throw new BadRequestError('Request body is required (a JSON document)');
      // The media type before any parameters; Koa's `ctx.is` (type-is) cost 0.6% of a proxied call for this.
      if (ctx.get('content-type').split(';', 1)[0].trim().toLowerCase() !== 'application/json') {
        throw new BadRequestError(
          `Content-Type must be application/json, not ${JSON.stringify((ctx.get('content-type') || 'none').slice(0, 100))}`,
        );
      }
      const charset = /charset\s*=\s*"?([^";\s]+)/i.exec(ctx.get('content-type'))?.[1]?.toLowerCase();
      if (charset && charset !== 'utf-8' && charset !== 'utf8')
        throw new BadRequestError(`Request body must be UTF-8, not ${JSON.stringify(charset.slice(0, 40))}`);
      if (read) {
        const sink = new InMemory();
        const workspaceId = (ctx.state.auth as { workspaceId?: string } | undefined)?.workspaceId ?? '';
        const encoding = await readBody(ctx.req, limits, sink, memory ? { memory, workspaceId } : undefined);
        const size = sink.chunks.reduce((n, c) => n + c.length, 0);
        if (encoding === 'identity' && size >= TURN_SPLIT_BYTES) {
          // Decoded from the chunks as they came, in turns: joining and decoding 10 MB took ~40 ms
          // each in one turn here (fresh memory is slow to touch).
          if (bodyBytes && workspaceId && size >= bodyBytes.minBytes) await bodyBytes.admit(workspaceId, size);
          ctx.request.body = await parseLargeBody(await strictUtf8Pieces(sink.chunks), limits.maxDepth);
          await nextTurn(); // and handled in a turn of its own
        } else {
          const raw = sink.chunks.length === 1 ? sink.chunks[0] : Buffer.concat(sink.chunks);
          // Sent as is (nearly every call): no await, which would cost the hot path a turn.
          const decoded = encoding === 'identity' ? raw : await inflated(raw, encoding, limits.limitBytes);
          if (bodyBytes && workspaceId && decoded.length >= bodyBytes.minBytes) await bodyBytes.admit(workspaceId, decoded.length);
          if (decoded.length < TURN_SPLIT_BYTES) {
            ctx.request.body = parseJsonBytes(decoded, limits.maxDepth);
          } else {
            // An inflated body: decoded, parsed and handled each in turns of their own.
            await nextTurn();
            ctx.request.body = await parseLargeBody([utf8Text(decoded)], limits.maxDepth);
            await nextTurn();
          }
        }
      }
    } catch (err) {
      closeUnread(ctx);
      throw err;
    }
    await next();
  };
}

/**
 * After a refusal: the unread rest of the body would otherwise sit on a kept-alive socket, so the
 * connection ends, once the client has had the time to read the answer (api/lingering-close).
 */
export function closeUnread(ctx: Koa.Context): void {
  if (ctx.req.readableEnded) return;
  ctx.set('Connection', 'close');
  dropUnread(ctx.req);
}

declare module 'koa' {
  interface Request {
    body?: unknown;
  }
}
