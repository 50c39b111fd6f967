// JSON request bodies, read by hand because every step has a limit a hostile client tests:
// only application/json; identity, gzip, deflate or br encoding, inflated no further than the size
// limit (counted on decoded bytes, so a small gzip bomb stops at the limit); a body that stalls is
// refused rather than held open; strict UTF-8; no `__proto__` keys; bounded
// nesting. Any refusal closes the connection, since the rest of the body was never read.
import zlib from 'node:zlib';
import { pipeline, type Readable } from 'node:stream';
import type Koa from 'koa';
import bourne from '@hapi/bourne';
import { BadRequestError, PayloadTooLargeError, RequestTimeoutError, type GatewayError } from '../infrastructure/errors';

export interface BodyLimits {
  /** Decoded bytes. */
  limitBytes: number;
  /** Objects and arrays nested deeper than this are refused. */
  maxDepth: number;
  /** A body that sends nothing for this long is refused with 408. */
  idleMs: number;
}

const DECODERS: Record<string, (() => zlib.Gunzip | zlib.Inflate | zlib.BrotliDecompress) | null> = {
  identity: null,
  gzip: () => zlib.createGunzip(),
  'x-gzip': () => zlib.createGunzip(),
  deflate: () => zlib.createInflate(),
  br: () => zlib.createBrotliDecompress(),
};

/** Depth of the deepest object or array in JSON text (strings skipped), stopping once past `max`. */
function jsonDepthOver(text: string, max: number): boolean {
  let depth = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 34 /* " */) {
      for (i++; i < text.length; i++) {
        const d = text.charCodeAt(i);
        if (d === 92 /* \ */) i++;
        else if (d === 34) break;
      }
    } else if (c === 123 /* { */ || c === 91 /* [ */) {
      if (++depth > max) return true;
    } else if (c === 125 || c === 93) {
      depth--;
    }
  }
  return false;
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

/** The most bytes a request's body may decode to: its Content-Length when it is sent as is, else the limit. */
export function mostBodyBytes(req: Koa.Request['req'], limitBytes: number): number {
  const declared = Number(req.headers['content-length']);
  return encodingOf(req) === 'identity' && declared > 0 ? Math.min(declared, limitBytes) : limitBytes;
}

/** The body as it arrived, in pieces: a large one is never copied into one buffer on the event loop. */
function readAll(req: Koa.Request['req'], limits: BodyLimits): Promise<Buffer[]> {
  const encoding = encodingOf(req);
  if (!(encoding in DECODERS))
    throw new BadRequestError(
      `Content-Encoding ${JSON.stringify(encoding.slice(0, 40))} is not supported (use identity, gzip, deflate or br)`,
    );
  const declared = Number(req.headers['content-length']);
  if (encoding === 'identity' && declared > limits.limitBytes)
    throw new PayloadTooLargeError('Request body is larger than the configured limit');
  const decoder = DECODERS[encoding]?.() ?? null;
  // pipeline, not pipe: a request that ends early or errors must end the decoder too.
  const source: Readable = decoder ? pipeline(req, decoder, () => undefined) : req;
  return new Promise<Buffer[]>((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const watching: Watched = {
      sweeps: Math.max(1, Math.ceil(limits.idleMs / SWEEP_MS)),
      quiet: 0,
      active: true,
      stall: () => finish(new RequestTimeoutError(`Request body stalled: nothing received for ${limits.idleMs} ms`)),
    };
    // Settles once; stops reading without destroying the request, whose socket still carries the answer.
    const finish = (err: GatewayError | null) => {
      watched.delete(watching);
      source.off('data', onData).off('end', onEnd).off('error', onError);
      req.off('aborted', onAborted);
      if (err) {
        source.pause();
        if (decoder) req.unpipe(decoder);
        decoder?.destroy();
        reject(err);
      } else {
        resolve(chunks);
      }
    };
    const onData = (chunk: Buffer) => {
      watching.active = true;
      size += chunk.length;
      if (size > limits.limitBytes) return finish(new PayloadTooLargeError('Request body is larger than the configured limit'));
      chunks.push(chunk);
    };
    const onEnd = () => finish(null);
    const onError = (err: NodeJS.ErrnoException) => {
      const corrupt =
        decoder &&
        (err.code?.startsWith('Z_') || err.code === 'ERR_BROTLI_DECOMPRESSION_FAILED' || err.code === 'ERR__ERROR_FORMAT_PADDING_1');
      finish(new BadRequestError(corrupt ? `Request body is not valid ${encoding} data` : 'Request body was not received in full'));
    };
    // The client went away mid-body (or sent less than its Content-Length and closed).
    const onAborted = () => finish(new BadRequestError('Request body was not received in full'));
    source.on('data', onData).on('end', onEnd).on('error', onError);
    req.on('aborted', onAborted);
    watch(watching);
  });
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

/** Parses JSON text as a request body: an object or array, safe keys, bounded depth. */
function parseJsonBody(text: string, maxDepth: number): unknown {
  if (!/^[\x20\x09\x0a\x0d]*[[{]/.test(text)) throw new BadRequestError('Request body is not valid JSON (expected an object)');
  if (jsonDepthOver(text, maxDepth)) throw new BadRequestError(`Request body nests deeper than ${maxDepth} levels`);
  try {
    return bourne.parse(text, { protoAction: 'error' });
  } catch (err) {
    if (/prototype/.test((err as Error).message)) throw new BadRequestError('Request body contains a forbidden key ("__proto__")');
    throw new BadRequestError('Request body is not valid JSON');
  }
}

/** The body as JSON: strict UTF-8, no deeper than `maxDepth`, no `__proto__` key. */
export function parseJsonBytes(raw: Uint8Array, maxDepth: number): unknown {
  let text: string;
  try {
    text = utf8.decode(raw);
  } catch {
    throw new BadRequestError('Request body is not valid UTF-8');
  }
  return parseJsonBody(text, maxDepth);
}

/**
 * Reads a JSON body into `ctx.request.body`; with `parse: false`, only its bytes into
 * `ctx.request.rawBody`, for a route that parses it elsewhere (a large batch, off the event loop).
 */
export function jsonBody(limits: BodyLimits, { parse = true } = {}): Koa.Middleware {
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
      const raw = await readAll(ctx.req, limits);
      if (parse) ctx.request.body = parseJsonBytes(raw.length === 1 ? raw[0] : Buffer.concat(raw), limits.maxDepth);
      else ctx.request.rawBody = raw;
    } catch (err) {
      // The unread rest of the body would otherwise sit on a kept-alive socket.
      if (!ctx.req.readableEnded) ctx.set('Connection', 'close');
      throw err;
    }
    await next();
  };
}

declare module 'koa' {
  interface Request {
    body?: unknown;
    /** The body's bytes in the pieces they arrived in (`jsonBody` with `parse: false`). */
    rawBody?: Buffer[];
  }
}
