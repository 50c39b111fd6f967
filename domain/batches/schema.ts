// Batches (interface §2.7, §3, §4.3; design.md §3).
import { Type } from '@sinclair/typebox';
import { KeyedRecord, Nullable, StringEnum } from '../../infrastructure/validation/types';

export const BATCH_ENDPOINTS = ['/v1/chat/completions', '/v1/responses', '/v1/messages', '/v1/embeddings'] as const;
export const BATCH_STATUSES = [
  'validating',
  'in_progress',
  'finalizing',
  'completed',
  'failed',
  'expired',
  'cancelling',
  'cancelled',
] as const;
export const TERMINAL_STATUSES = ['completed', 'failed', 'expired', 'cancelled'] as const;
/** A batch in one of these has work or a close still ahead of it: a run of its workflow should exist. */
export const OPEN_STATUSES = BATCH_STATUSES.filter(
  (s): s is Exclude<(typeof BATCH_STATUSES)[number], (typeof TERMINAL_STATUSES)[number]> =>
    !(TERMINAL_STATUSES as readonly string[]).includes(s),
);

export const CreateBatchBody = Type.Object(
  {
    endpoint: StringEnum([...BATCH_ENDPOINTS]),
    model: Type.String({ minLength: 1, maxLength: 256 }),
    requests: Type.Array(
      Type.Object(
        {
          custom_id: Type.String({ minLength: 1, maxLength: 256 }),
          body: Type.Record(Type.String(), Type.Unknown(), { description: 'A request body for the endpoint' }),
        },
        { additionalProperties: false },
      ),
      { minItems: 1 },
    ),
    completion_window: Type.Optional(
      Type.String({ pattern: '^([1-9]|[1-9][0-9]|1[0-5][0-9]|16[0-8])h$', description: '1h to 168h; default 24h' }),
    ),
    provider: Type.Optional(
      Type.Union([
        Type.Object(
          { only: Type.Optional(Type.Union([Type.Array(Type.String({ minLength: 1 }), { maxItems: 64 }), Type.Null()])) },
          { additionalProperties: false },
        ),
        Type.Null(),
      ]),
    ),
    metadata: Type.Optional(KeyedRecord({ maxLength: 64 }, Type.String({ maxLength: 512 }), { maxProperties: 16 })),
    callback_url: Type.Optional(
      Type.String({
        minLength: 1,
        maxLength: 2048,
        description: 'Receives the batch object, signed (Standard Webhooks), when the batch reaches a terminal state',
      }),
    ),
  },
  { additionalProperties: false },
);

const ResultLine = Type.Object({
  id: Type.String(),
  custom_id: Type.String(),
  response: Nullable(Type.Object({ status_code: Type.Integer(), request_id: Type.String(), body: Type.Unknown() })),
  error: Nullable(Type.Object({ type: Type.String(), message: Type.String(), code: Type.Optional(Type.Integer()) })),
});

export const BatchObject = Type.Object({
  id: Type.String(),
  object: Type.Literal('batch'),
  endpoint: Type.String(),
  model: Type.String(),
  completion_window: Type.String(),
  status: StringEnum([...BATCH_STATUSES]),
  created_at: Type.Integer(),
  in_progress_at: Nullable(Type.Integer()),
  finalized_at: Nullable(Type.Integer()),
  expires_at: Nullable(Type.Integer()),
  provider: Nullable(Type.String()),
  request_counts: Type.Object({ total: Type.Integer(), completed: Type.Integer(), failed: Type.Integer() }),
  usage: Nullable(
    Type.Object({ prompt_tokens: Type.Integer(), completion_tokens: Type.Integer(), total_tokens: Type.Integer(), cost: Type.Number() }),
  ),
  results: Nullable(Type.Array(ResultLine)),
  error: Nullable(Type.Object({ message: Type.String() })),
  metadata: Nullable(Type.Record(Type.String(), Type.String())),
  callback_url: Type.Optional(Nullable(Type.String())),
  webhook: Type.Optional(
    Nullable(
      Type.Object({
        status: StringEnum(['delivered', 'failed']),
        attempts: Type.Integer(),
        last_status: Nullable(Type.Integer()),
        last_error: Nullable(Type.String()),
      }),
    ),
  ),
});

export const BatchIdParams = Type.Object({ id: Type.String({ pattern: '^batch_[0-9a-z]{6,40}$' }) });

export const ListBatchesQuery = Type.Object(
  {
    limit: Type.Integer({ minimum: 1, maximum: 100, default: 20 }),
    after: Type.Optional(Type.String({ pattern: '^batch_[0-9a-z]{6,40}$' })),
    status: Type.Optional(Type.Array(StringEnum([...BATCH_STATUSES]))),
    created_after: Type.Optional(Type.String({ minLength: 1 })),
    created_before: Type.Optional(Type.String({ minLength: 1 })),
  },
  { additionalProperties: false },
);

export const BatchQuery = Type.Object(
  {
    include_results: Type.Optional(
      Type.Boolean({ description: 'false: a terminal batch without its inline results (for polling progress)', default: true }),
    ),
  },
  { additionalProperties: false },
);

export const ResultsQuery = Type.Object(
  {
    after: Type.Optional(Type.Integer({ minimum: -1, description: 'Line number; results after it' })),
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 100000 })),
  },
  { additionalProperties: false },
);
