// What each batch target endpoint accepts in a line's body, checked when the batch is created (the
// workflow's validation step reads the result; a bad line fails the whole batch, naming it, before
// any line is sent upstream).
import { Type, type TSchema } from '@sinclair/typebox';
import { compileBody, type Validator } from '../../infrastructure/validation/index';
import { EmbeddingsInput } from '../completions/schema';
import { statelessResponses } from '../presets/schema';
import { attributionFields } from '../../infrastructure/validation/types';
import { BadRequestError } from '../../infrastructure/errors';
import type { Operation } from '../catalog';
import type { BatchEndpoint } from './store';

const NoStream = Type.Optional(Type.Literal(false, { description: 'batches do not stream' }));
const Message = Type.Object({ role: Type.String({ minLength: 1 }), content: Type.Unknown() }, { additionalProperties: true });

const SCHEMAS: Record<BatchEndpoint, TSchema> = {
  '/v1/chat/completions': Type.Object(
    {
      ...attributionFields,
      messages: Type.Array(Message, { minItems: 1 }),
      stream: NoStream,
      max_tokens: Type.Optional(Type.Integer({ minimum: 1 })),
      max_completion_tokens: Type.Optional(Type.Integer({ minimum: 1 })),
      n: Type.Optional(Type.Literal(1)),
    },
    { additionalProperties: true },
  ),
  '/v1/responses': Type.Object(
    {
      ...attributionFields,
      ...statelessResponses,
      input: Type.Union([Type.String({ minLength: 1 }), Type.Array(Type.Unknown(), { minItems: 1 })]),
      stream: NoStream,
      max_output_tokens: Type.Optional(Type.Integer({ minimum: 1 })),
    },
    { additionalProperties: true },
  ),
  '/v1/messages': Type.Object(
    {
      ...attributionFields,
      messages: Type.Array(Message, { minItems: 1 }),
      max_tokens: Type.Integer({ minimum: 1 }),
      stream: NoStream,
    },
    { additionalProperties: true },
  ),
  '/v1/embeddings': Type.Object(
    {
      ...attributionFields,
      input: EmbeddingsInput,
      dimensions: Type.Optional(Type.Integer({ minimum: 1 })),
    },
    { additionalProperties: true },
  ),
};

const validators = Object.fromEntries(Object.entries(SCHEMAS).map(([k, s]) => [k, compileBody(s)])) as unknown as Record<
  BatchEndpoint,
  Validator<unknown>
>;

export const OPERATION_OF: Record<BatchEndpoint, Exclude<Operation, 'systemone'>> = {
  '/v1/chat/completions': 'chat',
  '/v1/responses': 'responses',
  '/v1/messages': 'messages',
  '/v1/embeddings': 'embeddings',
};

/** Null when the body suits the endpoint, else why not (naming the field). */
export function lineProblem(endpoint: BatchEndpoint, body: unknown): string | null {
  try {
    validators[endpoint](body);
    return null;
  } catch (err) {
    if (err instanceof BadRequestError) return err.message.replace(/^body: /, '');
    throw err;
  }
}

/** What checking lines found: how many do not suit the endpoint, and the first ten named. */
export interface LineCheck {
  invalid: number;
  examples: string[];
}

/**
 * Checks one line's body, counting it into `into` when it does not suit the endpoint. Only the
 * first ten bad lines are described: a report costs ~10 µs a line, and a batch of 50,000 bad lines
 * described in full held the create request's process for half a second.
 */
export function checkLine(endpoint: BatchEndpoint, customId: string, body: unknown, into: LineCheck): void {
  if (validators[endpoint].valid(body)) return;
  into.invalid++;
  if (into.examples.length < 10) into.examples.push(`${customId} (${lineProblem(endpoint, body)})`);
}
