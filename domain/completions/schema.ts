// The synchronous inference requests (OpenAI chat completions, Anthropic messages, OpenAI responses,
// embeddings) and their answers. The request shapes extend the bodies presets are created from
// (domain/presets/schema), so a field means the same in both; the answers are each provider's own shape
// plus what the gateway adds (our generation id, the dated model id, `provider`, `usage.cost`).
import { Type } from '@sinclair/typebox';
import { AnthropicMessage, ChatBody, ChatMessage, MessagesBody, ResponsesBody } from '../presets/schema';
import { attributionFields, Nullable, StringEnum } from '../../infrastructure/validation/types';
import { ProviderPreferences } from '../routing/preferences';

const Model = Type.String({ minLength: 1, maxLength: 256 });
const Models = Type.Array(Model, { minItems: 1, maxItems: 8, description: 'Fallback models, tried in order after `model`' });
const Preset = Type.String({ minLength: 1, maxLength: 128, description: 'A preset slug (or `@preset/<slug>` in `model`)' });
const StreamOptions = Type.Object(
  { include_usage: Type.Optional(Type.Boolean({ description: 'Send usage (with cost) in a last chunk' })) },
  { additionalProperties: true },
);
const UsageOption = Type.Object(
  { include: Type.Optional(Type.Boolean({ description: 'OpenRouter form of stream_options.include_usage' })) },
  { additionalProperties: false },
);

/** Inputs to embed: text, texts, a token array or token arrays. Batch lines take the same. */
export const EmbeddingsInput = Type.Union([
  Type.String({ minLength: 1 }),
  Type.Array(Type.String(), { minItems: 1, maxItems: 2048 }),
  Type.Array(Type.Integer(), { minItems: 1, maxItems: 8192 }),
  Type.Array(Type.Array(Type.Integer(), { minItems: 1, maxItems: 8192 }), { minItems: 1, maxItems: 2048 }),
]);

const routing = {
  model: Type.Optional(Model),
  models: Type.Optional(Models),
  preset: Type.Optional(Preset),
  provider: Type.Optional(ProviderPreferences),
};

export const ChatCompletionRequest = Type.Object(
  {
    ...ChatBody.properties,
    ...routing,
    messages: Type.Array(ChatMessage, { minItems: 1 }),
    stream_options: Type.Optional(Nullable(StreamOptions)),
    usage: Type.Optional(UsageOption),
  },
  { additionalProperties: true },
);

export const MessagesRequest = Type.Object(
  {
    ...MessagesBody.properties,
    ...routing,
    messages: Type.Array(AnthropicMessage, { minItems: 1 }),
    max_tokens: Type.Optional(Type.Integer({ minimum: 1, description: 'Required, here or in the preset' })),
  },
  { additionalProperties: true },
);

export const ResponsesRequest = Type.Object(
  {
    ...ResponsesBody.properties,
    ...routing,
    input: Type.Union([Type.String({ minLength: 1 }), Type.Array(Type.Unknown(), { minItems: 1 })]),
    usage: Type.Optional(UsageOption),
  },
  { additionalProperties: true },
);

export const EmbeddingsRequest = Type.Object(
  {
    ...routing,
    input: EmbeddingsInput,
    dimensions: Type.Optional(Type.Integer({ minimum: 1, maximum: 65536 })),
    encoding_format: Type.Optional(StringEnum(['float', 'base64'])),
    stream: Type.Optional(Type.Literal(false, { description: 'Embeddings are not streamed' })),
    ...attributionFields,
  },
  { additionalProperties: true },
);

const gatewayFields = {
  id: Type.String({ description: 'Generation id: GET /generation?id= finds its usage and cost' }),
  model: Type.String({ description: 'Dated canonical id of the model that answered' }),
  provider: Type.String({ description: 'The provider that answered' }),
};
const Usage = Type.Object({ cost: Type.Number({ description: 'USD debited' }) }, { additionalProperties: true });

export const ChatCompletion = Type.Object(
  { ...gatewayFields, object: Type.Literal('chat.completion'), choices: Type.Array(Type.Unknown()), usage: Usage },
  { additionalProperties: true },
);
export const Message = Type.Object(
  { ...gatewayFields, type: Type.Literal('message'), content: Type.Array(Type.Unknown()), usage: Usage },
  { additionalProperties: true },
);
export const Response = Type.Object(
  { ...gatewayFields, object: Type.Literal('response'), output: Type.Array(Type.Unknown()), usage: Usage },
  { additionalProperties: true },
);
export const Embeddings = Type.Object(
  { ...gatewayFields, object: Type.Literal('list'), data: Type.Array(Type.Unknown()), usage: Usage },
  { additionalProperties: true },
);
