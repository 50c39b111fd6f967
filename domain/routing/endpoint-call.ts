// One call to one endpoint, in its provider's wire format: the body is passed through with the
// upstream model id; the format says where it goes, how it is authenticated and what it used.
import type { Endpoint, Operation } from '../catalog';
import { UpstreamFailure } from '../../infrastructure/providers/failure';
import { PROVIDER_FORMATS, type ProviderFormat, type Usage } from '../../infrastructure/providers/formats';
import type { ProviderHttp, StreamResponse } from '../../infrastructure/providers/http';

export interface ProviderResponse {
  body: any;
  usage: Usage;
  latencyMs: number;
}

interface CallOptions {
  signal?: AbortSignal;
  env: Record<string, string | undefined>;
}

/** The endpoint's format and the URL of the operation, refusing an operation the format does not serve. */
function target(e: Endpoint, operation: Operation): { format: ProviderFormat; url: string } {
  const format = PROVIDER_FORMATS[e.provider.adapter];
  const path = format.paths[operation];
  if (!path) {
    throw new UpstreamFailure(
      'invalid_response',
      e.provider.slug,
      `${e.provider.slug} (${e.provider.adapter}) does not serve ${operation}`,
    );
  }
  return { format, url: `${e.provider.base_url}${path}` };
}

function httpOptions(e: Endpoint, format: ProviderFormat, opts: CallOptions) {
  const key = e.provider.api_key_env ? opts.env[e.provider.api_key_env] : undefined;
  return {
    provider: e.provider.slug,
    headers: format.headers(key),
    timeoutMs: e.provider.timeout_ms,
    signal: opts.signal,
    failureOf: format.failureOf,
  };
}

/** Opens a streamed call; its events are the provider's, in its format. */
export async function openEndpointStream(
  http: ProviderHttp,
  e: Endpoint,
  operation: Operation,
  body: Record<string, unknown>,
  opts: CallOptions,
): Promise<StreamResponse> {
  const { format, url } = target(e, operation);
  return http.postStream(url, format.streamBody(operation, { ...body, model: e.entry.upstream_model }), httpOptions(e, format, opts));
}

export async function callEndpoint(
  http: ProviderHttp,
  e: Endpoint,
  operation: Operation,
  body: Record<string, unknown>,
  opts: CallOptions,
): Promise<ProviderResponse> {
  const { format, url } = target(e, operation);
  const started = performance.now();
  const res = await http.postJson(url, { ...body, model: e.entry.upstream_model }, httpOptions(e, format, opts));
  return { body: res.body, usage: format.usageOf(operation, res.body), latencyMs: performance.now() - started };
}

/** An error event in a stream the endpoint accepted, as the failure it means (null: not an error). */
export function streamErrorOf(e: Endpoint, event: Parameters<ProviderFormat['streamError']>[0]): UpstreamFailure | null {
  return PROVIDER_FORMATS[e.provider.adapter].streamError(event, e.provider.slug);
}
