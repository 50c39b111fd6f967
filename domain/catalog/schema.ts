// The catalog file's schema: providers and models, each model with its endpoints and prices.
import { Type, type Static } from '@sinclair/typebox';
import { StringEnum } from '../../infrastructure/validation/types';
import { FORMAT_NAMES } from '../../infrastructure/providers/formats';

export type { Operation } from '../../infrastructure/providers/formats';

export const QUANTIZATIONS = ['int4', 'int8', 'fp4', 'mxfp4', 'nvfp4', 'fp6', 'fp8', 'mxfp8', 'fp16', 'bf16', 'fp32', 'unknown'] as const;
const Quantization = StringEnum([...QUANTIZATIONS]);

const Slug = Type.String({ pattern: '^[a-z0-9][a-z0-9._-]*$', maxLength: 64 });

export const ProviderEntry = Type.Object(
  {
    slug: Slug,
    name: Type.String({ minLength: 1 }),
    /** The provider's wire format (infrastructure/providers/formats/): which operations it serves, and how. */
    adapter: StringEnum(FORMAT_NAMES),
    /** May use ${VAR} placeholders, filled from the environment when the catalog loads. */
    base_url: Type.String({ minLength: 1 }),
    api_key_env: Type.Optional(Type.String({ pattern: '^[A-Z_][A-Z0-9_]*$' })),
    /** Whether the provider stores prompts and may train on them (`data_collection: deny` excludes it). */
    collects_data: Type.Boolean(),
    zdr: Type.Boolean({ description: 'zero data retention' }),
    max_concurrency: Type.Integer({ minimum: 1, maximum: 10000 }),
    timeout_ms: Type.Integer({ minimum: 100, maximum: 3_600_000 }),
    /** Keys of `provider.options.<slug>` forwarded to this provider's request body; others are dropped. */
    accepted_options: Type.Optional(Type.Array(Type.String())),
  },
  { additionalProperties: false },
);

const Pricing = Type.Object(
  {
    prompt: Type.Number({ minimum: 0, description: 'USD per million prompt tokens' }),
    completion: Type.Number({ minimum: 0, description: 'USD per million completion tokens' }),
    request: Type.Optional(Type.Number({ minimum: 0, description: 'USD per request' })),
    cache_read: Type.Optional(
      Type.Number({
        minimum: 0,
        description: 'USD per million prompt tokens read from the provider’s prompt cache (default: the prompt price)',
      }),
    ),
    cache_write: Type.Optional(
      Type.Number({
        minimum: 0,
        description: 'USD per million prompt tokens written to it (default: 1.25 × the prompt price, Anthropic’s 5-minute write)',
      }),
    ),
    web_search: Type.Optional(
      Type.Number({ minimum: 0, description: 'USD per web search the provider runs for a call (its server-side search tool)' }),
    ),
    cache_write_1h: Type.Optional(
      Type.Number({ minimum: 0, description: 'USD per million prompt tokens written to its 1-hour cache (default: 2 × the prompt price)' }),
    ),
    image: Type.Optional(
      Type.Number({ minimum: 0, description: 'USD per image in the prompt (inline or by reference), beyond the tokens it counts as' }),
    ),
    audio: Type.Optional(
      Type.Number({
        minimum: 0,
        description: 'USD per million audio prompt tokens (OpenAI’s input_audio); calls sending audio go only to endpoints with this price',
      }),
    ),
    audio_completion: Type.Optional(
      Type.Number({
        minimum: 0,
        description:
          'USD per million audio completion tokens (OpenAI’s audio output); calls asking for audio go only to endpoints with this price',
      }),
    ),
  },
  { additionalProperties: false },
);

export const EndpointEntry = Type.Object(
  {
    provider: Slug,
    /** Variant of the provider's endpoint (`turbo` makes the tag `provider/turbo`). */
    variant: Type.Optional(Slug),
    upstream_model: Type.String({ minLength: 1 }),
    pricing: Pricing,
    quantization: Quantization,
    supported_parameters: Type.Array(Type.String()),
    max_completion_tokens: Type.Optional(Type.Integer({ minimum: 1 })),
    service_tier: Type.Optional(
      Type.String({
        minLength: 1,
        description:
          'The provider tier this endpoint serves, at its own prices ("priority": OpenAI\'s priority processing, asked for with service_tier; "fast": Anthropic\'s fast mode, asked for with speed). Calls asking for a tier go only to endpoints of that tier, and other calls never do',
      }),
    ),
  },
  { additionalProperties: false },
);

export const ModelEntry = Type.Object(
  {
    /** `author/slug-version`, e.g. `typesafe/jev-1.13`. */
    id: Type.String({ pattern: '^[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._:-]*$' }),
    name: Type.String(),
    kind: StringEnum(['decision', 'chat', 'embedding']),
    /** Models of one family share `-latest`; the newest `version` wins. */
    family: Type.String(),
    version: Type.String({ pattern: '^\\d+(\\.\\d+)*$' }),
    /** Release date, `YYYYMMDD`; the dated canonical id is `<id>-<date>`. */
    released: Type.String({ pattern: '^\\d{8}$' }),
    aliases: Type.Optional(Type.Array(Type.String())),
    context_length: Type.Integer({ minimum: 1 }),
    distillable: Type.Boolean({ description: 'the author allows text distillation' }),
    description: Type.Optional(Type.String()),
    endpoints: Type.Array(EndpointEntry, { minItems: 1 }),
  },
  { additionalProperties: false },
);

export const CatalogFile = Type.Object(
  {
    providers: Type.Array(ProviderEntry, { minItems: 1 }),
    models: Type.Array(ModelEntry, { minItems: 1 }),
  },
  { additionalProperties: false },
);

export type ProviderEntry = Static<typeof ProviderEntry>;
export type EndpointEntry = Static<typeof EndpointEntry>;
export type ModelEntry = Static<typeof ModelEntry>;
export type CatalogFile = Static<typeof CatalogFile>;
