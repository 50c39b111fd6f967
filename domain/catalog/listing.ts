import { Type } from '@sinclair/typebox';

const Percentiles = Type.Union([
  Type.Object({ p50: Type.Number(), p75: Type.Number(), p90: Type.Number(), p99: Type.Number() }),
  Type.Null(),
]);
const Pricing = Type.Object({
  prompt: Type.String({ description: 'USD per prompt token' }),
  completion: Type.String({ description: 'USD per completion token' }),
  request: Type.String({ description: 'USD per request' }),
  input_cache_read: Type.Optional(Type.String({ description: 'USD per prompt token read from the provider’s cache' })),
  input_cache_write: Type.Optional(Type.String({ description: 'USD per prompt token written to it' })),
  input_cache_write_1h: Type.Optional(Type.String({ description: 'USD per prompt token written to its 1-hour cache' })),
  web_search: Type.Optional(Type.String({ description: 'USD per web search; calls that may search go only to endpoints with this price' })),
  audio: Type.Optional(Type.String({ description: 'USD per audio prompt token; calls sending audio go only to endpoints with it' })),
  audio_completion: Type.Optional(
    Type.String({ description: 'USD per audio completion token; calls asking for audio go only to endpoints with it' }),
  ),
  image: Type.Optional(Type.String({ description: 'USD per image in the prompt' })),
});

export const ModelView = Type.Object({
  id: Type.String(),
  canonical_slug: Type.String({ description: 'Dated canonical id' }),
  name: Type.String(),
  kind: Type.String(),
  created: Type.Integer({ description: 'Release date, unix seconds' }),
  description: Type.String(),
  context_length: Type.Integer(),
  pricing: Pricing,
  aliases: Type.Array(Type.String()),
  supported_parameters: Type.Array(Type.String()),
});

export const EndpointView = Type.Object({
  name: Type.String(),
  tag: Type.String(),
  provider_name: Type.String(),
  model_id: Type.String(),
  context_length: Type.Integer(),
  pricing: Pricing,
  quantization: Type.String(),
  max_completion_tokens: Type.Union([Type.Integer(), Type.Null()]),
  supported_parameters: Type.Array(Type.String()),
  service_tier: Type.Union([Type.String(), Type.Null()], { description: 'The provider tier it serves; null: the standard one' }),
  data_collection: Type.String(),
  zdr: Type.Boolean(),
  max_concurrency_per_process: Type.Integer({
    description:
      "Calls one gateway process keeps in flight to this endpoint's provider; the limit is per process, so N processes allow up to N times this",
  }),
  stats_window_seconds: Type.Integer(),
  uptime: Type.Union([Type.Number(), Type.Null()]),
  recent_outage: Type.Boolean(),
  latency_seconds: Percentiles,
  throughput_tokens_per_second: Percentiles,
});

export const ModelEndpointsParams = Type.Object({ author: Type.String({ minLength: 1 }), slug: Type.String({ minLength: 1 }) });
