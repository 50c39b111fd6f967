// One call to one endpoint, in its provider's wire format: the body is sent with the upstream model
// id, translated first when the provider serves the operation only through another one (see
// infrastructure/providers/translate); the format says where it goes, how it is authenticated and
// what it used, and the answer comes back in the caller's operation's terms.
import type { EventSourceMessage } from 'eventsource-parser';
import type { Endpoint, Operation } from '../catalog';
import { UpstreamFailure } from '../../infrastructure/providers/failure';
import { BadRequestError } from '../../infrastructure/errors';
import { PROVIDER_FORMATS, type ProviderFormat, type Usage } from '../../infrastructure/providers/formats';
import type { ProviderHttp, StreamResponse } from '../../infrastructure/providers/http';
import { translationFor, type StreamTranslator, type Translation } from '../../infrastructure/providers/translate';
import { countedFromRequest, withCounted } from '../completions/counted-from-request';
import { withFields } from '../../infrastructure/objects/with-fields';

export interface ProviderResponse {
  /** The answer, in the terms of the operation asked for. */
  body: any;
  usage: Usage;
  latencyMs: number;
  /** Parameters the provider's format could not take, dropped from the request. */
  dropped: string[];
}

interface CallOptions {
  signal?: AbortSignal;
  env: Record<string, string | undefined>;
  /** `provider.require_parameters`: a parameter the translation would drop makes this endpoint refuse the call instead. */
  requireParameters?: boolean;
}

interface Target {
  format: ProviderFormat;
  url: string;
  /** The operation the provider is called with. */
  operation: Operation;
  translation: Translation | null;
}

/** Where and how the endpoint is called for the operation, refusing one its format cannot serve. */
function target(e: Endpoint, operation: Operation): Target {
  const format = PROVIDER_FORMATS[e.provider.adapter];
  const translation = translationFor(e.provider.adapter, operation);
  if (translation === undefined) {
    throw new UpstreamFailure(
      'invalid_response',
      e.provider.slug,
      `${e.provider.slug} (${e.provider.adapter}) does not serve ${operation}`,
    );
  }
  const sent = translation?.target ?? operation;
  return { format, url: `${e.provider.base_url}${format.paths[sent]}`, operation: sent, translation };
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

/** The body the provider is sent: translated if need be, with the upstream model id. */
function upstreamBody(
  e: Endpoint,
  t: Target,
  body: Record<string, unknown>,
  dropped: string[],
  opts: CallOptions,
): Record<string, unknown> {
  const sent = t.translation ? t.translation.request(body, dropped) : body;
  if (opts.requireParameters && dropped.length) {
    // Required parameters are never dropped: this endpoint cannot take the call (another may).
    throw new BadRequestError(
      `provider.require_parameters: ${[...dropped].sort().join(', ')} cannot be sent to ${e.provider.slug} (${e.provider.adapter} format)`,
    );
  }
  // An endpoint of a tier is billed at its prices, so the provider is always asked for that tier
  // (a call opted in to it, by `:nitro` say, did not ask itself), in the provider's own terms.
  const tier = e.entry.service_tier ? t.format.tiers[e.entry.service_tier] : undefined;
  const model = e.entry.upstream_model;
  return withFields(sent, tier ? withFields(tier, { model }) : { model });
}

export interface OpenedEndpointStream {
  response: StreamResponse;
  /** Turns each of the provider's events into the caller's format's (null: they are the same). */
  translate: StreamTranslator | null;
  dropped: string[];
}

/** Opens a streamed call; its events are the provider's, in its format, with the translator to the caller's. */
export async function openEndpointStream(
  http: ProviderHttp,
  e: Endpoint,
  operation: Operation,
  body: Record<string, unknown>,
  opts: CallOptions,
): Promise<OpenedEndpointStream> {
  const t = target(e, operation);
  const dropped: string[] = [];
  const sent = t.format.streamBody(t.operation, upstreamBody(e, t, body, dropped, opts));
  const response = await http.postStream(t.url, sent, httpOptions(e, t.format, opts));
  return { response, translate: t.translation?.stream() ?? null, dropped };
}

export async function callEndpoint(
  http: ProviderHttp,
  e: Endpoint,
  operation: Operation,
  body: Record<string, unknown>,
  opts: CallOptions,
): Promise<ProviderResponse> {
  const t = target(e, operation);
  const dropped: string[] = [];
  const sent = upstreamBody(e, t, body, dropped, opts);
  const started = performance.now();
  const res = await http.postJson(t.url, sent, httpOptions(e, t.format, opts));
  const usage = withCounted(t.format.usageOf(t.operation, res.body), countedFromRequest(operation, body, dropped));
  const answer = t.translation ? t.translation.answer(res.body) : res.body;
  return { body: answer, usage, latencyMs: performance.now() - started, dropped };
}

/** An error event in a stream the endpoint accepted, as the failure it means (null: not an error). */
export function streamErrorOf(e: Endpoint, event: EventSourceMessage): UpstreamFailure | null {
  return PROVIDER_FORMATS[e.provider.adapter].streamError(event, e.provider.slug);
}
