// Keep-alive HTTP to providers over undici, with per-call timeouts and cancellation.
import { Agent, request, errors as undiciErrors, util as undiciUtil, type Dispatcher } from 'undici';
import { sizeText } from '../errors/sizes';
import { nextTurn, TURN_SPLIT_BYTES } from '../concurrency/next-turn';
import { hasLongArray, parseInTurns, stringifyInTurns, utf8InTurns, utf8Pieces } from '../concurrency/json-in-turns';
import { parseRetryAfter, UpstreamFailure } from './failure';

export interface JsonResponse {
  status: number;
  body: any;
}

export interface StreamResponse {
  status: number;
  /** The body as it arrives; reading it slowly slows the provider down (TCP backpressure). */
  body: Dispatcher.ResponseData['body'];
}

interface CallOptions {
  provider: string;
  headers: Record<string, string>;
  timeoutMs: number;
  signal?: AbortSignal;
  /** What an error answer means, read in the provider's format. */
  failureOf(status: number, body: unknown, provider: string, retryAfterMs: number | null): UpstreamFailure;
}

/**
 * One answer read whole, through undici's dispatcher. `request()` wraps every answer in a stream
 * and an async resource, which an answer read at once does not need: 45-47 µs of CPU a call
 * against 55-60 (measured, keep-alive calls to the sandbox), on every synchronous call's path.
 * Its failures are the ones `request()` raises (timeouts, aborts, connection errors).
 */
class WholeAnswer implements Dispatcher.DispatchHandler {
  status = 0;
  rawHeaders: Buffer[] = [];
  private readonly chunks: Buffer[] = [];
  private bytes = 0;
  private abort: ((err: Error) => void) | null = null;
  private aborted: Error | null = null;
  private readonly onAbort = () => {
    this.aborted = new undiciErrors.RequestAbortedError();
    this.abort?.(this.aborted);
  };

  constructor(
    /** The answer's text: in pieces (decoded in turns) when it is TURN_SPLIT_BYTES or more. */
    private readonly done: (err: Error | null, text?: string | string[]) => void,
    private readonly signal: AbortSignal | undefined,
    /** Past this many bytes the answer is given up (`tooLarge`). */
    private readonly maxBytes: number,
    private readonly tooLarge: () => UpstreamFailure,
  ) {
    signal?.addEventListener('abort', this.onAbort, { once: true });
  }

  onConnect(abort: (err: Error) => void): void {
    if (this.aborted) abort(this.aborted);
    else this.abort = abort;
  }

  onHeaders(status: number, rawHeaders: Buffer[]): boolean {
    if (status < 200) return true; // informational: the answer follows
    this.status = status;
    this.rawHeaders = rawHeaders;
    return true;
  }

  onData(chunk: Buffer): boolean {
    this.bytes += chunk.length;
    if (this.bytes > this.maxBytes) {
      this.abort?.(this.tooLarge()); // undici then calls onError with it
      return false;
    }
    this.chunks.push(chunk);
    return true;
  }

  onComplete(): void {
    this.signal?.removeEventListener('abort', this.onAbort);
    // A large answer (embeddings: 2,048 of 3,072 dimensions are 33 MB even as base64) is decoded
    // in turns, as pieces (parsed from them in turns too: postJson).
    if (this.bytes < TURN_SPLIT_BYTES)
      this.done(null, this.chunks.length === 1 ? this.chunks[0].toString('utf8') : Buffer.concat(this.chunks).toString('utf8'));
    else this.pieces().then((pieces) => this.done(null, pieces), this.done);
  }

  /** The answer decoded into pieces of about TURN_SPLIT_BYTES, each in a turn of its own. */
  private pieces(): Promise<string[]> {
    return utf8Pieces(this.chunks.splice(0), false);
  }

  onError(err: Error): void {
    this.signal?.removeEventListener('abort', this.onAbort);
    this.done(err);
  }
}

/**
 * What every provider call sends: a POST whose timeout bounds the wait for the answer's headers and
 * then each silence within its body. undici's own timers do that, which costs less per call than a
 * timeout signal joined to the caller's (this is every synchronous request's hot path).
 */
function postOptions<X extends object>(body: string | Buffer, accept: string, opts: CallOptions, extra: X) {
  // The caller's fields last: a spread before further fields is Node 20's slow path (objects/with-fields.ts).
  return {
    method: 'POST' as const,
    headersTimeout: opts.timeoutMs,
    bodyTimeout: opts.timeoutMs,
    headers: { 'content-type': 'application/json', accept, ...opts.headers },
    body,
    ...extra,
  };
}

/**
 * The body as JSON text; a large one as UTF-8 serialised and encoded in turns: a conversation of
 * 30,000 messages (9 MB) held the loop 66 ms to serialise and 37 ms more to encode in one turn.
 */
function sendable(body: unknown): string | Promise<string | Buffer> {
  if (body !== null && typeof body === 'object' && hasLongArray(body)) return inTurns(body);
  const text = JSON.stringify(body);
  return text.length < TURN_SPLIT_BYTES ? text : utf8InTurns([text]);
}

async function inTurns(body: object): Promise<string | Buffer> {
  const pieces = await stringifyInTurns(body);
  // A conversation of many short messages is serialised in no more turns than it needs: none.
  return pieces.length === 1 && pieces[0].length < TURN_SPLIT_BYTES ? pieces[0] : await utf8InTurns(pieces);
}

/** A non-2xx answer as the failure it means, with the provider's own words. */
function failureOf(status: number, text: string, headers: Dispatcher.ResponseData['headers'], opts: CallOptions): UpstreamFailure {
  let parsed: unknown = null;
  try {
    parsed = text ? JSON.parse(text) : null;
  } catch {
    parsed = null;
  }
  return opts.failureOf(status, parsed, opts.provider, parseRetryAfter(headers['retry-after']));
}

/** How much of an error answer is read for its message; the rest is dropped. */
const ERROR_TEXT_BYTES = 64 * 1024;

export class ProviderHttp {
  constructor(
    /** The most an answer, or one event of a stream, may hold (UPSTREAM_MAX_ANSWER_BYTES). */
    readonly maxAnswerBytes: number,
  ) {}

  /** The failure of an answer (or a stream's event) past `maxAnswerBytes`: a broken provider, not a big one. */
  answerTooLarge(provider: string): UpstreamFailure {
    return new UpstreamFailure('invalid_response', provider, `Provider sent an answer over ${sizeText(this.maxAnswerBytes)}`);
  }

  private readonly agent = new Agent({ keepAliveTimeout: 30_000, keepAliveMaxTimeout: 600_000, connections: 512 });
  /** Each endpoint URL parsed once (the catalog's URLs: a bounded set). */
  private readonly places = new Map<string, { origin: string; path: string }>();

  private place(url: string): { origin: string; path: string } {
    let p = this.places.get(url);
    if (!p) {
      const u = new URL(url);
      p = { origin: u.origin, path: u.pathname + u.search };
      if (this.places.size < 10_000) this.places.set(url, p);
    }
    return p;
  }

  /** A streamed call's POST, through `request()` (its body is read as it arrives); failures come back classified. */
  private async post(url: string, body: unknown, accept: string, opts: CallOptions): Promise<Dispatcher.ResponseData> {
    const sent = sendable(body);
    const options = postOptions(typeof sent === 'string' ? sent : await sent, accept, opts, {
      dispatcher: this.agent,
      signal: opts.signal,
    });
    try {
      return await request(url, options);
    } catch (err) {
      throw this.classify(err, opts.provider, opts.timeoutMs);
    }
  }

  /** An error answer's first ERROR_TEXT_BYTES, for its message. */
  private async errorTextOf(res: Dispatcher.ResponseData, opts: CallOptions): Promise<string> {
    const chunks: Buffer[] = [];
    let bytes = 0;
    try {
      for await (const chunk of res.body as AsyncIterable<Buffer>) {
        chunks.push(chunk);
        bytes += chunk.length;
        if (bytes >= ERROR_TEXT_BYTES) break; // leaving the loop destroys the body
      }
    } catch (err) {
      throw this.classify(err, opts.provider, opts.timeoutMs);
    }
    return Buffer.concat(chunks).subarray(0, ERROR_TEXT_BYTES).toString('utf8');
  }

  /** One JSON answer. */
  async postJson(url: string, body: unknown, opts: CallOptions): Promise<JsonResponse> {
    const sent = sendable(body);
    const bytes = typeof sent === 'string' ? sent : await sent;
    if (opts.signal?.aborted) throw this.classify(new undiciErrors.RequestAbortedError(), opts.provider, opts.timeoutMs);
    const options = postOptions(bytes, 'application/json', opts, this.place(url));
    let answer!: WholeAnswer;
    const text = await new Promise<string | string[]>((resolve, reject) => {
      answer = new WholeAnswer(
        (err, text) => (err ? reject(this.classify(err, opts.provider, opts.timeoutMs)) : resolve(text!)),
        opts.signal,
        this.maxAnswerBytes,
        () => this.answerTooLarge(opts.provider),
      );
      try {
        this.agent.dispatch(options, answer);
      } catch (err) {
        answer.onError(err as Error);
      }
    });
    const status = answer.status;
    const large = typeof text !== 'string';
    if (status < 200 || status >= 300)
      throw failureOf(status, large ? text.join('') : text, undiciUtil.parseHeaders(answer.rawHeaders), opts);
    let parsed: any;
    try {
      parsed = large ? await parseInTurns(text) : text ? JSON.parse(text) : null;
    } catch {
      parsed = null;
    }
    if (large) await nextTurn(); // and handled in a turn of its own
    if (parsed === null || typeof parsed !== 'object')
      throw new UpstreamFailure('invalid_response', opts.provider, 'Provider returned a response that is not a JSON object', status);
    return { status, body: parsed };
  }

  /** Opens a streamed call; the timeout is per silence, not for the whole stream, which may rightly run for minutes. */
  async postStream(url: string, body: unknown, opts: CallOptions): Promise<StreamResponse> {
    const res = await this.post(url, body, 'text/event-stream', opts);
    if (res.statusCode >= 200 && res.statusCode < 300) return { status: res.statusCode, body: res.body };
    throw failureOf(res.statusCode, await this.errorTextOf(res, opts), res.headers, opts);
  }

  classify(err: unknown, provider: string, timeoutMs: number): UpstreamFailure {
    if (err instanceof UpstreamFailure) return err;
    const e = err as { name?: string; code?: string; message?: string };
    if (e?.name === 'AbortError' || e?.code === 'UND_ERR_ABORTED') return new UpstreamFailure('aborted', provider, 'Request was cancelled');
    if (err instanceof undiciErrors.HeadersTimeoutError || err instanceof undiciErrors.BodyTimeoutError) {
      return new UpstreamFailure('timeout', provider, `Provider did not answer within ${timeoutMs} ms`);
    }
    return new UpstreamFailure('connection', provider, `Could not reach provider: ${e?.code ?? e?.message ?? 'connection error'}`);
  }

  async close(): Promise<void> {
    await this.agent.close();
  }
}
