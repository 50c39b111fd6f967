// Keep-alive HTTP to providers over undici, with per-call timeouts and cancellation.
import { Agent, request, errors as undiciErrors } from 'undici';
import { parseRetryAfter, UpstreamFailure } from './failure';

export interface JsonResponse {
  status: number;
  body: any;
  headers: Record<string, string | string[] | undefined>;
}

/** The provider's own words from an error body, in the OpenAI, Anthropic or plain shapes. */
function upstreamMessage(body: any, status: number): { message: string; type: string | null } {
  const e = body?.error ?? body;
  const message = typeof e?.message === 'string' ? e.message : typeof body?.detail === 'string' ? body.detail : `HTTP ${status}`;
  return { message, type: typeof e?.type === 'string' ? e.type : null };
}

export class ProviderHttp {
  private readonly agent = new Agent({ keepAliveTimeout: 30_000, keepAliveMaxTimeout: 600_000, connections: 512 });

  async postJson(
    url: string,
    body: unknown,
    opts: { provider: string; headers: Record<string, string>; timeoutMs: number; signal?: AbortSignal },
  ): Promise<JsonResponse> {
    const timeout = AbortSignal.timeout(opts.timeoutMs);
    const signal = opts.signal ? AbortSignal.any([opts.signal, timeout]) : timeout;
    let res;
    try {
      res = await request(url, {
        method: 'POST',
        dispatcher: this.agent,
        signal,
        headers: { 'content-type': 'application/json', accept: 'application/json', ...opts.headers },
        body: JSON.stringify(body),
      });
    } catch (err) {
      throw this.classify(err, opts.provider, timeout, opts.timeoutMs);
    }
    let text: string;
    try {
      text = await res.body.text();
    } catch (err) {
      throw this.classify(err, opts.provider, timeout, opts.timeoutMs);
    }
    let parsed: any;
    try {
      parsed = text ? JSON.parse(text) : null;
    } catch {
      parsed = null;
    }
    if (res.statusCode >= 200 && res.statusCode < 300) {
      if (parsed === null || typeof parsed !== 'object')
        throw new UpstreamFailure(
          'invalid_response',
          opts.provider,
          'Provider returned a response that is not a JSON object',
          res.statusCode,
        );
      return { status: res.statusCode, body: parsed, headers: res.headers };
    }
    const { message, type } = upstreamMessage(parsed, res.statusCode);
    const retryAfter = parseRetryAfter(res.headers['retry-after']);
    const kind =
      res.statusCode === 529 || type === 'overloaded_error' || type === 'overloaded'
        ? 'overloaded'
        : res.statusCode === 429
          ? 'rate_limited'
          : 'http';
    throw new UpstreamFailure(kind, opts.provider, message, res.statusCode, retryAfter);
  }

  private classify(err: unknown, provider: string, timeout: AbortSignal, timeoutMs: number): UpstreamFailure {
    if (err instanceof UpstreamFailure) return err;
    if (timeout.aborted) return new UpstreamFailure('timeout', provider, `Provider did not answer within ${timeoutMs} ms`);
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
