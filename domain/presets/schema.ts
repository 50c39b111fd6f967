// Presets (interface §2.4, §4.2): the inference bodies a preset is created from, and the preset
// objects returned. Known fields are validated; unknown top-level fields are ignored, because the
// overlap rule stores only configuration fields anyway.
import { Type, type Static, type TSchema } from '@sinclair/typebox';
import { attributionFields, Nullable, StringEnum, Timestamp } from '../../infrastructure/validation/types';
import { ProviderPreferences } from '../routing/preferences';

const Strict = { additionalProperties: false } as const;

/** A union chosen by one property (`type` or `id`), as `oneOf` + `discriminator`. */
function tagged<T extends TSchema[]>(propertyName: string, branches: [...T]) {
  return Type.Unsafe<Static<T[number]>>({ type: 'object', required: [propertyName], oneOf: branches, discriminator: { propertyName } });
}

const CacheControl = Type.Object({ type: Type.Literal('ephemeral'), ttl: Type.Optional(StringEnum(['5m', '1h'])) }, Strict);

const Fallbacks = Nullable(
  Type.Array(Type.Object({ model: Type.String({ minLength: 1 }) }, Strict), {
    maxItems: 3,
    description: 'Fallback models, tried in order; only `model` per entry',
  }),
);

const OutputConfig = Type.Object(
  {
    effort: Type.Optional(Nullable(StringEnum(['low', 'medium', 'high', 'xhigh', 'max']))),
    format: Type.Optional(Type.Object({ type: Type.Literal('json_schema'), schema: Type.Record(Type.String(), Type.Unknown()) }, Strict)),
    task_budget: Type.Optional(
      Type.Object(
        { type: Type.Literal('tokens'), total: Type.Integer({ minimum: 20000 }), remaining: Type.Optional(Type.Integer({ minimum: 0 })) },
        Strict,
      ),
    ),
  },
  Strict,
);

const routerFields = {
  allowed_models: Type.Optional(Type.Array(Type.String({ maxLength: 1024 }), { maxItems: 1024 })),
  excluded_models: Type.Optional(Type.Array(Type.String({ maxLength: 1024 }), { maxItems: 1024 })),
  cost_tier: Type.Optional(StringEnum(['low', 'medium', 'high', 'xhigh', 'max'])),
  cost_quality_tradeoff: Type.Optional(Type.Number({ minimum: 0, maximum: 10 })),
  enabled: Type.Optional(Type.Boolean()),
};
const enabled = { enabled: Type.Optional(Type.Boolean()) };
const Domains = Type.Optional(Type.Array(Type.String()));

/** The eleven plugin variants, by `id`. */
const Plugin = tagged('id', [
  Type.Object({ id: Type.Literal('auto-router'), ...routerFields, pin_model: Type.Optional(Type.Boolean()) }, Strict),
  Type.Object({ id: Type.Literal('auto-beta-router'), ...routerFields }, Strict),
  Type.Object({ id: Type.Literal('context-compression'), engine: Type.Optional(Type.Literal('middle-out')), ...enabled }, Strict),
  Type.Object(
    {
      id: Type.Literal('file-parser'),
      pdf: Type.Optional(
        Type.Object({ engine: Type.Optional(StringEnum(['mistral-ocr', 'native', 'cloudflare-ai', 'pdf-text'])) }, Strict),
      ),
      ...enabled,
    },
    Strict,
  ),
  Type.Object(
    {
      id: Type.Literal('fusion'),
      analysis_models: Type.Optional(Type.Array(Type.String(), { maxItems: 8 })),
      model: Type.Optional(Type.String()),
      preset: Type.Optional(StringEnum(['general-high', 'general-budget', 'general-fast'])),
      max_tool_calls: Type.Optional(Type.Integer({ minimum: 0, maximum: 16 })),
      tools: Type.Optional(Type.Array(Type.Unknown())),
      ...enabled,
    },
    Strict,
  ),
  Type.Object({ id: Type.Literal('moderation') }, Strict),
  Type.Object(
    {
      id: Type.Literal('pareto-router'),
      min_coding_score: Type.Optional(Type.Number({ minimum: 0, maximum: 1 })),
      max_price: Type.Optional(Type.Number({ minimum: 0 })),
      price_source: Type.Optional(StringEnum(['prompt', 'weighted_avg'])),
      ...enabled,
    },
    Strict,
  ),
  Type.Object({ id: Type.Literal('response-healing'), ...enabled }, Strict),
  Type.Object(
    {
      id: Type.Literal('switchyard-router'),
      algorithm: Type.Optional(StringEnum(['capability', 'stage', 'auto', 'random', 'composite', 'passthrough'])),
      ...enabled,
    },
    Strict,
  ),
  Type.Object(
    {
      id: Type.Literal('web'),
      engine: Type.Optional(StringEnum(['native', 'exa', 'firecrawl', 'parallel', 'perplexity'])),
      max_results: Type.Optional(Type.Integer({ minimum: 1 })),
      max_uses: Type.Optional(Type.Integer({ minimum: 1 })),
      mode: Type.Optional(Type.String()),
      search_prompt: Type.Optional(Type.String()),
      include_domains: Domains,
      exclude_domains: Domains,
      user_location: Type.Optional(
        Type.Object(
          {
            type: Type.Literal('approximate'),
            city: Type.Optional(Type.String()),
            country: Type.Optional(Type.String()),
            region: Type.Optional(Type.String()),
            timezone: Type.Optional(Type.String()),
          },
          Strict,
        ),
      ),
      x_search: Type.Optional(Type.Boolean()),
      ...enabled,
    },
    Strict,
  ),
  Type.Object(
    {
      id: Type.Literal('web-fetch'),
      allowed_domains: Domains,
      blocked_domains: Domains,
      max_content_tokens: Type.Optional(Type.Integer({ minimum: 1 })),
      max_uses: Type.Optional(Type.Integer({ minimum: 1 })),
    },
    Strict,
  ),
]);

/** Conditions that stop the server-tool agent loop (any one fires: OR), by `type`. */
const StopCondition = tagged('type', [
  Type.Object({ type: Type.Literal('step_count_is'), step_count: Type.Integer({ minimum: 1 }) }, Strict),
  Type.Object({ type: Type.Literal('has_tool_call'), tool_name: Type.String({ minLength: 1 }) }, Strict),
  Type.Object({ type: Type.Literal('max_tokens_used'), max_tokens: Type.Integer({ minimum: 1 }) }, Strict),
  Type.Object({ type: Type.Literal('max_cost'), max_cost_in_dollars: Type.Number({ exclusiveMinimum: 0 }) }, Strict),
  Type.Object({ type: Type.Literal('finish_reason_is'), reason: Type.String({ minLength: 1 }) }, Strict),
]);

const Thinking = tagged('type', [
  Type.Object(
    {
      type: Type.Literal('enabled'),
      budget_tokens: Type.Integer({ minimum: 1 }),
      display: Type.Optional(Type.String()),
      block_binding: Type.Optional(Type.Unknown()),
    },
    Strict,
  ),
  Type.Object({ type: Type.Literal('disabled') }, Strict),
  Type.Object(
    { type: Type.Literal('adaptive'), display: Type.Optional(Type.String()), block_binding: Type.Optional(Type.Unknown()) },
    Strict,
  ),
]);

const ToolChoice = tagged('type', [
  Type.Object({ type: Type.Literal('auto'), disable_parallel_tool_use: Type.Optional(Type.Boolean()) }, Strict),
  Type.Object({ type: Type.Literal('any'), disable_parallel_tool_use: Type.Optional(Type.Boolean()) }, Strict),
  Type.Object({ type: Type.Literal('none') }, Strict),
  Type.Object(
    { type: Type.Literal('tool'), name: Type.String({ minLength: 1 }), disable_parallel_tool_use: Type.Optional(Type.Boolean()) },
    Strict,
  ),
]);

/** Anthropic-native, OpenRouter server and custom tools: identified by `name` or `type`. */
const Tool = Type.Object(
  {
    type: Type.Optional(Type.String({ minLength: 1 })),
    name: Type.Optional(Type.String({ minLength: 1 })),
    input_schema: Type.Optional(Type.Record(Type.String(), Type.Unknown())),
    cache_control: Type.Optional(CacheControl),
  },
  { additionalProperties: true, anyOf: [{ required: ['type'] }, { required: ['name'] }] },
);

const TextBlock = Type.Object(
  { type: Type.Literal('text'), text: Type.String(), cache_control: Type.Optional(CacheControl) },
  { additionalProperties: true },
);

export const AnthropicMessage = Type.Object(
  { role: StringEnum(['user', 'assistant']), content: Type.Union([Type.String(), Type.Array(Type.Unknown())]) },
  { additionalProperties: true },
);

export const MessagesBody = Type.Object(
  {
    model: Type.String({ minLength: 1 }),
    messages: Type.Optional(Nullable(Type.Array(AnthropicMessage))),
    system: Type.Optional(Type.Union([Type.String(), Type.Array(TextBlock)])),
    max_tokens: Type.Optional(Type.Integer({ minimum: 1 })),
    cache_control: Type.Optional(CacheControl),
    context_management: Type.Optional(
      Nullable(Type.Object({ edits: Type.Optional(Type.Array(Type.Record(Type.String(), Type.Unknown()))) }, Strict)),
    ),
    fallbacks: Type.Optional(Fallbacks),
    models: Type.Optional(Type.Array(Type.String({ minLength: 1 }))),
    metadata: Type.Optional(Type.Object({ user_id: Type.Optional(Nullable(Type.String())) }, Strict)),
    output_config: Type.Optional(OutputConfig),
    plugins: Type.Optional(Type.Array(Plugin)),
    provider: Type.Optional(ProviderPreferences),
    route: Type.Optional(
      Nullable(StringEnum(['fallback', 'sort'], { deprecated: true, description: 'Deprecated: use provider.sort.partition' })),
    ),
    safeguards: Type.Optional(Nullable(Type.Array(Type.Object({ type: Type.String() }, { additionalProperties: true })))),
    service_tier: Type.Optional(Type.String()),
    speed: Type.Optional(Nullable(StringEnum(['fast', 'standard'], { description: 'Default standard' }))),
    stop_sequences: Type.Optional(Type.Array(Type.String())),
    stop_server_tools_when: Type.Optional(Type.Array(StopCondition, { minItems: 1 })),
    stream: Type.Optional(Type.Boolean()),
    temperature: Type.Optional(Type.Number({ minimum: 0, maximum: 2 })),
    thinking: Type.Optional(Thinking),
    tool_choice: Type.Optional(ToolChoice),
    tools: Type.Optional(Type.Array(Tool)),
    top_k: Type.Optional(Type.Integer({ minimum: 0 })),
    top_p: Type.Optional(Type.Number({ minimum: 0, maximum: 1 })),
    ...attributionFields,
  },
  { additionalProperties: true },
);

export const ChatMessage = Type.Object(
  {
    role: StringEnum(['system', 'developer', 'user', 'assistant', 'tool']),
    content: Type.Union([Type.String(), Type.Array(Type.Unknown()), Type.Null()]),
  },
  { additionalProperties: true },
);

/** Fields the chat and responses bodies share. */
const sharedInferenceFields = {
  model: Type.String({ minLength: 1 }),
  models: Type.Optional(Type.Array(Type.String({ minLength: 1 }))),
  provider: Type.Optional(ProviderPreferences),
  route: Type.Optional(Nullable(StringEnum(['fallback', 'sort']))),
  temperature: Type.Optional(Type.Number({ minimum: 0, maximum: 2 })),
  top_p: Type.Optional(Type.Number({ minimum: 0, maximum: 1 })),
  tools: Type.Optional(Type.Array(Type.Object({ type: Type.String() }, { additionalProperties: true }))),
  plugins: Type.Optional(Type.Array(Plugin)),
  ...attributionFields,
  stream: Type.Optional(Type.Boolean()),
};

export const ChatBody = Type.Object(
  {
    ...sharedInferenceFields,
    messages: Type.Optional(Type.Array(ChatMessage)),
    max_tokens: Type.Optional(Type.Integer({ minimum: 1 })),
    max_completion_tokens: Type.Optional(Type.Integer({ minimum: 1 })),
    n: Type.Optional(
      Type.Integer({ minimum: 1, maximum: 128, description: 'Choices to generate; the provider bills each, and the call holds for each' }),
    ),
  },
  { additionalProperties: true },
);

/**
 * A provider's stored response or conversation cannot be named: answers carry the gateway's ids,
 * never the provider's, and a provider that never saw the id would answer without the history.
 */
const NotKept = Type.Optional(
  // Anything but null (null names no conversation, as some clients send it).
  Type.Not(Type.Not(Type.Null()), {
    description: 'the gateway keeps no conversations (it is stateless): send the whole conversation in input',
  }),
);
export const statelessResponses = {
  previous_response_id: NotKept,
  conversation: NotKept,
  // A background response is answered queued and fetched by id later: the gateway would bill nothing
  // for what the provider then bills, and its client could not fetch it.
  background: Type.Optional(
    Type.Literal(false, { description: 'the gateway answers a response once it is done and keeps none to fetch later' }),
  ),
};

export const ResponsesBody = Type.Object(
  {
    ...sharedInferenceFields,
    ...statelessResponses,
    input: Type.Optional(Type.Unknown()),
    instructions: Type.Optional(Nullable(Type.String())),
    max_output_tokens: Type.Optional(Type.Integer({ minimum: 1 })),
  },
  { additionalProperties: true },
);

export const SlugParams = Type.Object({
  slug: Type.String({ minLength: 1, maxLength: 128, pattern: '^[A-Za-z0-9][A-Za-z0-9._~-]*$', description: 'URL-safe' }),
});
export const VersionParams = Type.Object({ slug: SlugParams.properties.slug, version: Type.Integer({ minimum: 1 }) });
export const PageQuery = Type.Object(
  {
    offset: Type.Integer({ minimum: 0, default: 0 }),
    limit: Type.Integer({ minimum: 1, maximum: 100, default: 50 }),
  },
  { additionalProperties: false },
);

export const PresetVersion = Type.Object({
  id: Type.String({ format: 'uuid' }),
  preset_id: Type.String({ format: 'uuid' }),
  version: Type.Integer({ minimum: 1 }),
  config: Type.Record(Type.String(), Type.Unknown()),
  system_prompt: Nullable(Type.String()),
  creator_id: Type.String(),
  created_at: Timestamp,
  updated_at: Timestamp,
});

const Preset = Type.Object({
  id: Type.String({ format: 'uuid' }),
  name: Type.String(),
  slug: Type.String(),
  description: Nullable(Type.String()),
  status: Type.Literal('active'),
  status_updated_at: Nullable(Timestamp),
  created_at: Timestamp,
  updated_at: Timestamp,
  creator_user_id: Type.String(),
  workspace_id: Type.String({ format: 'uuid' }),
  designated_version_id: Type.String({ format: 'uuid' }),
});

export const PresetWithVersion = Type.Intersect([Preset, Type.Object({ designated_version: PresetVersion })]);
