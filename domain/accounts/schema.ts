import { Type } from '@sinclair/typebox';
import { StringEnum, Timestamp } from '../../infrastructure/validation/types';

const KeyKind = StringEnum(['inference', 'management']);

export const PublicKey = Type.Object({
  id: Type.String(),
  workspace_id: Type.String({ format: 'uuid' }),
  kind: KeyKind,
  name: Type.String(),
  label: Type.String({ description: 'Recognisable start and end of the key; not usable as a key' }),
  created_at: Timestamp,
  revoked_at: Type.Union([Timestamp, Type.Null()]),
});

export const CreateKeyBody = Type.Object(
  {
    name: Type.Optional(Type.String({ minLength: 1, maxLength: 100 })),
    kind: Type.Optional(KeyKind),
  },
  { additionalProperties: false },
);

const KeyId = Type.String({ pattern: '^key_[0-9a-f]{24}$' });

export const KeyIdParams = Type.Object({ id: KeyId });

export const ListKeysQuery = Type.Object(
  {
    limit: Type.Integer({ minimum: 1, maximum: 100, default: 100 }),
    after: Type.Optional({ ...KeyId, description: 'The last_id of the previous page' }),
  },
  { additionalProperties: false },
);

export const CurrentKey = Type.Object({
  data: Type.Object({
    id: Type.String(),
    label: Type.String(),
    name: Type.String(),
    kind: KeyKind,
    workspace_id: Type.String(),
    usage: Type.Number({ description: 'USD spent by the workspace' }),
    limit: Type.Null(),
    is_free_tier: Type.Boolean(),
    rate_limit: Type.Object({ requests: Type.Integer(), interval: Type.String() }, { description: "This key's" }),
    workspace_rate_limit: Type.Object(
      { requests: Type.Integer(), interval: Type.String() },
      { description: "The workspace's, over all its keys" },
    ),
  }),
});

export const Credits = Type.Object({
  data: Type.Object({ total_credits: Type.Number(), total_usage: Type.Number(), balance: Type.Number() }),
});

export const Storage = Type.Object({
  data: Type.Object({
    stored_bytes: Type.Integer({ description: 'Batch inputs, preset versions and keys the workspace keeps, as stored' }),
    quota_bytes: Type.Integer({ description: 'What it may keep (WORKSPACE_STORAGE_BYTES); past it, creates are 402s' }),
  }),
});

export const GenerationQuery = Type.Object({ id: Type.String({ minLength: 1, maxLength: 200 }) }, { additionalProperties: false });

export const Generation = Type.Object({
  data: Type.Object({
    id: Type.String(),
    model: Type.String(),
    provider_name: Type.Union([Type.String(), Type.Null()]),
    tokens_prompt: Type.Integer(),
    tokens_completion: Type.Integer(),
    tokens_cache_read: Type.Integer({
      description: 'Of tokens_prompt, read from the provider’s prompt cache (billed at its cache_read price)',
    }),
    tokens_cache_write: Type.Integer({ description: 'Of tokens_prompt, written to it (billed at its cache_write price)' }),
    tokens_cache_write_1h: Type.Integer({ description: 'Of tokens_cache_write, written to its 1-hour cache (billed at cache_write_1h)' }),
    web_searches: Type.Integer({ description: 'Web searches the provider ran for the call (billed at its web_search price)' }),
    tokens_audio_prompt: Type.Integer({ description: 'Of tokens_prompt, audio (billed at its audio price)' }),
    tokens_audio_completion: Type.Integer({ description: 'Of tokens_completion, audio (billed at its audio_completion price)' }),
    images: Type.Integer({ description: 'Images in the prompt, billed at its image price where the catalog gives one' }),
    total_cost: Type.Number(),
    created_at: Timestamp,
    session_id: Type.Union([Type.String(), Type.Null()]),
    user: Type.Union([Type.String(), Type.Null()]),
    app_title: Type.Union([Type.String(), Type.Null()]),
    app_referer: Type.Union([Type.String(), Type.Null()]),
    batch_id: Type.Union([Type.String(), Type.Null()]),
  }),
});
