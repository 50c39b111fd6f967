// The catalog as clients see it: models with prices, and each model's endpoints with their live
// latency, throughput and uptime.
import { Type } from '@sinclair/typebox';
import type { CatalogModel, Endpoint } from '../../domain/catalog';
import { OUTAGE_WINDOW_MS, type EndpointStat } from '../../domain/routing/engine';
import { defineRoute, type AnyRoute } from '../route';
import { EndpointView, ModelEndpointsParams, ModelView } from '../../domain/catalog/listing';
import type { AppDeps } from '../deps';

/** Per-million prices as OpenRouter writes them: USD per token, as a decimal string. */
function perToken(perMillion: number): string {
  return (perMillion / 1e6).toFixed(12).replace(/\.?0+$/, '') || '0';
}

/**
 * An endpoint's prices, with OpenRouter's names: the prices of what a call may ask for beyond tokens
 * only when the catalog gives them, since calls asking for it go only where it does.
 */
function pricing(e: Endpoint) {
  const p = e.entry.pricing;
  const token = (v: number | undefined) => (v === undefined ? undefined : perToken(v));
  return {
    prompt: perToken(p.prompt),
    completion: perToken(p.completion),
    request: String(p.request ?? 0),
    input_cache_read: token(p.cache_read),
    input_cache_write: token(p.cache_write),
    input_cache_write_1h: token(p.cache_write_1h),
    web_search: p.web_search === undefined ? undefined : String(p.web_search),
    audio: token(p.audio),
    audio_completion: token(p.audio_completion),
    image: p.image === undefined ? undefined : String(p.image),
  };
}

function releasedAt(m: CatalogModel): number {
  return Date.UTC(Number(m.released.slice(0, 4)), Number(m.released.slice(4, 6)) - 1, Number(m.released.slice(6, 8))) / 1000;
}

function modelView(m: CatalogModel) {
  const cheapest = [...m.endpoints].sort((a, b) => a.entry.pricing.prompt - b.entry.pricing.prompt)[0];
  return {
    id: m.id,
    canonical_slug: m.canonicalId,
    name: m.name,
    kind: m.kind,
    created: releasedAt(m),
    description: m.description ?? '',
    context_length: m.context_length,
    pricing: pricing(cheapest),
    aliases: m.aliases ?? [],
    supported_parameters: [...new Set(m.endpoints.flatMap((e) => e.entry.supported_parameters))].sort(),
  };
}

function endpointView(e: Endpoint, s: EndpointStat | undefined, windowMs: number, now: number) {
  const full = (p: EndpointStat['latency']) => (p ? { p50: p.p50!, p75: p.p75!, p90: p.p90!, p99: p.p99! } : null);
  return {
    name: `${e.provider.name} | ${e.model.id}`,
    tag: e.tag,
    provider_name: e.provider.slug,
    model_id: e.model.id,
    context_length: e.model.context_length,
    pricing: pricing(e),
    quantization: e.entry.quantization,
    max_completion_tokens: e.entry.max_completion_tokens ?? null,
    supported_parameters: e.entry.supported_parameters,
    service_tier: e.entry.service_tier ?? null,
    data_collection: e.provider.collects_data ? 'allow' : 'deny',
    zdr: e.provider.zdr,
    max_concurrency_per_process: e.provider.max_concurrency,
    stats_window_seconds: Math.round(windowMs / 1000),
    uptime: s && s.requests + s.failures > 0 ? s.requests / (s.requests + s.failures) : null,
    recent_outage: !!s?.lastFailureAt && now - s.lastFailureAt < OUTAGE_WINDOW_MS,
    latency_seconds: full(s?.latency ?? null),
    throughput_tokens_per_second: full(s?.throughput ?? null),
  };
}

export function modelRoutes({ upstreams }: AppDeps): AnyRoute[] {
  return [
    defineRoute({
      method: 'get',
      path: '/models',
      tag: 'Models',
      auth: 'any',
      summary: 'Models in the catalog, with their lowest prices',
      responses: { 200: { description: 'Models', schema: Type.Object({ data: Type.Array(ModelView) }) } },
      handler: (ctx) => {
        ctx.body = { data: upstreams.catalog.models.map(modelView) };
      },
    }),
    defineRoute({
      method: 'get',
      path: '/models/:author/:slug/endpoints',
      tag: 'Models',
      auth: 'any',
      params: ModelEndpointsParams,
      summary: "A model's endpoints with prices and live latency, throughput and uptime",
      responses: {
        200: {
          description: 'Endpoints',
          schema: Type.Object({
            data: Type.Object({
              id: Type.String(),
              canonical_slug: Type.String(),
              name: Type.String(),
              endpoints: Type.Array(EndpointView),
            }),
          }),
        },
      },
      handler: (ctx, { params }) => {
        const { model } = upstreams.catalog.resolve(`${params.author}/${params.slug}`);
        const snapshot = upstreams.stats.snapshot();
        const now = Date.now();
        ctx.body = {
          data: {
            id: model.id,
            canonical_slug: model.canonicalId,
            name: model.name,
            endpoints: model.endpoints.map((e) => endpointView(e, snapshot.get(e.key), upstreams.stats.windowMs, now)),
          },
        };
      },
    }),
  ];
}
