// Keep-alive HTTP to providers over undici, with per-call timeouts and cancellation.
import { Agent, request, errors as undiciErrors, type Dispatcher } from 'undici';
import { parseRetryAfter, UpstreamFailure } from './failure';

export interface JsonResponse {
  status: number;
  body: any;
  headers: Record<string, string | string[] | undefined>;
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

export class ProviderHttp {
  private readonly agent = new Agent({ keepAliveTimeout: 30_000, keepAliveMaxTimeout: 600_000, connections: 512 });

  /**
   * A POST whose timeout bounds the wait for the answer's headers and then each silence within its
   * body. undici's own timers do that, which costs less per call than a timeout signal joined to the
   * caller's (this is every synchronous request's hot path); failures come back classified.
   */
  private async post(url: string, body: unknown, accept: string, opts: CallOptions): Promise<Dispatcher.ResponseData> {
    try {
      return await request(url, {
        method: 'POST',
        dispatcher: this.agent,
        signal: opts.signal,
        headersTimeout: opts.timeoutMs,
        bodyTimeout: opts.timeoutMs,
        headers: { 'content-type': 'application/json', accept, ...opts.headers },
        body: JSON.stringify(body),
      });
    } catch (err) {
      throw this.classify(err, opts.provider, opts.timeoutMs);
    }
  }

  private async textOf(res: Dispatcher.ResponseData, opts: CallOptions): Promise<string> {
    try {
      return await res.body.text();
    } catch (err) {
      throw this.classify(err, opts.provider, opts.timeoutMs);
    }
  }

  /** One JSON answer. */
  async postJson(url: string, body: unknown, opts: CallOptions): Promise<JsonResponse> {
    const res = await this.post(url, body, 'application/json', opts);
    const text = await this.textOf(res, opts);
    if (res.statusCode < 200 || res.statusCode >= 300) throw failureOf(res.statusCode, text, res.headers, opts);
    let parsed: any;
    try {
      parsed = text ? JSON.parse(text) : null;
    } catch {
      parsed = null;
    }
    if (parsed === null || typeof parsed !== 'object')
      throw new UpstreamFailure(
        'invalid_response',
        opts.provider,
        'Provider returned a response that is not a JSON object',
        res.statusCode,
      );
    return { status: res.statusCode, body: parsed, headers: res.headers };
  }

  /** Opens a streamed call; the timeout is per silence, not for the whole stream, which may rightly run for minutes. */
  async postStream(url: string, body: unknown, opts: CallOptions): Promise<StreamResponse> {
    const res = await this.post(url, body, 'text/event-stream', opts);
    if (res.statusCode >= 200 && res.statusCode < 300) return { status: res.statusCode, body: res.body };
    throw failureOf(res.statusCode, await this.textOf(res, opts), res.headers, opts);
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
