// Provider adapters: where each operation lives on each kind of provider, which headers it wants,
// and where its token counts are. The request body is passed through with the upstream model id.
import type { Endpoint, Operation } from '../catalog';
import { UpstreamFailure } from './failure';
import type { ProviderHttp, StreamResponse } from './http';
import { roundUsd } from '../catalog/usd';

export interface Usage {
  input_tokens: number;
  output_tokens: number;
}

export interface ProviderResponse {
  body: any;
  usage: Usage;
  latencyMs: number;
}

const PATHS: Record<Operation, string> = {
  chat: '/chat/completions',
  responses: '/responses',
  embeddings: '/embeddings',
  messages: '/v1/messages',
  systemone: '/v1/systemone',
};

function headersFor(e: Endpoint, env: Record<string, string | undefined>): Record<string, string> {
  const key = e.provider.api_key_env ? env[e.provider.api_key_env] : undefined;
  if (e.provider.adapter === 'anthropic') return { 'anthropic-version': '2023-06-01', ...(key ? { 'x-api-key': key } : {}) };
  return key ? { authorization: `Bearer ${key}` } : {};
}

export function usageOf(operation: Operation, body: any): Usage {
  const u = body?.usage ?? {};
  const int = (v: unknown) => (Number.isFinite(v) && (v as number) >= 0 ? Math.round(v as number) : 0);
  if (operation === 'chat') return { input_tokens: int(u.prompt_tokens), output_tokens: int(u.completion_tokens) };
  if (operation === 'embeddings') return { input_tokens: int(u.prompt_tokens ?? u.total_tokens), output_tokens: 0 };
  return { input_tokens: int(u.input_tokens), output_tokens: int(u.output_tokens) };
}

function assertServes(e: Endpoint, operation: Operation): void {
  if (!e.operations.includes(operation)) {
    throw new UpstreamFailure(
      'invalid_response',
      e.provider.slug,
      `${e.provider.slug} (${e.provider.adapter}) does not serve ${operation}`,
    );
  }
}

/**
 * Opens a streamed call. Chat completions report usage in a stream only when asked: the gateway
 * always asks, since it bills from it, and passes the usage on to the client only if it asked too.
 */
export async function openEndpointStream(
  http: ProviderHttp,
  e: Endpoint,
  operation: Operation,
  body: Record<string, unknown>,
  opts: { signal?: AbortSignal; env?: Record<string, string | undefined> } = {},
): Promise<StreamResponse> {
  assertServes(e, operation);
  const upstream: Record<string, unknown> = { ...body, model: e.entry.upstream_model, stream: true };
  if (operation === 'chat') upstream.stream_options = { ...(body.stream_options as object | undefined), include_usage: true };
  return http.postStream(`${e.provider.base_url}${PATHS[operation]}`, upstream, {
    provider: e.provider.slug,
    headers: headersFor(e, opts.env ?? process.env),
    timeoutMs: e.provider.timeout_ms,
    signal: opts.signal,
  });
}

export async function callEndpoint(
  http: ProviderHttp,
  e: Endpoint,
  operation: Operation,
  body: Record<string, unknown>,
  opts: { signal?: AbortSignal; env?: Record<string, string | undefined> } = {},
): Promise<ProviderResponse> {
  assertServes(e, operation);
  const started = performance.now();
  const res = await http.postJson(
    `${e.provider.base_url}${PATHS[operation]}`,
    { ...body, model: e.entry.upstream_model },
    {
      provider: e.provider.slug,
      headers: headersFor(e, opts.env ?? process.env),
      timeoutMs: e.provider.timeout_ms,
      signal: opts.signal,
    },
  );
  return { body: res.body, usage: usageOf(operation, res.body), latencyMs: performance.now() - started };
}

/** USD for a call: tokens at the endpoint's per-million prices, plus its per-request price. */
export function costOf(e: Endpoint, usage: Usage): number {
  const p = e.entry.pricing;
  const usd = (usage.input_tokens * p.prompt + usage.output_tokens * p.completion) / 1e6 + (p.request ?? 0);
  return roundUsd(usd);
}
