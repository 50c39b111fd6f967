// POST /systemone (interface §2.1–2.3). The limits are configurable, so the schema is built from
// them once at start-up; the default build gives the TypeScript types and the OpenAPI shapes.
import { Type, type Static, type TSchema } from '@sinclair/typebox';
import { attributionFields, KeyedRecord } from '../../infrastructure/validation/types';
import { ProviderPreferences } from '../routing/preferences';

export interface DecisionLimits {
  maxQuestions: number;
  maxChoices: number;
  maxScoreLevels: number;
  /** Bytes of the `state` value as JSON; more is 413. */
  maxStateBytes: number;
}

const DEFAULT_DECISION_LIMITS: DecisionLimits = { maxQuestions: 256, maxChoices: 255, maxScoreLevels: 255, maxStateBytes: 512 * 1024 };

/** Question names and choice labels. */
const NAME = { minLength: 1, maxLength: 256 };

type GuidanceValue = string | Record<string, unknown> | unknown[];

/**
 * Instructions, criteria and state: a string, a JSON object or a JSON array. One `type` list, not a
 * union of three schemas: Ajv records an error for each branch a union tries and refuses, and a
 * decision body is mostly guidance (the bench's took 4.8 µs to validate as unions, 2.2 as type
 * lists; a chat body 0.6).
 */
const Guidance = Type.Unsafe<GuidanceValue>({
  type: ['string', 'object', 'array'],
  description: 'A string, a JSON object or a JSON array',
});
const GuidanceOrNull = Type.Unsafe<GuidanceValue | null>({
  type: ['string', 'object', 'array', 'null'],
  description: 'A string, a JSON object, a JSON array or null',
});

/** A union discriminated by `type`, as JSON Schema `oneOf` + `discriminator` (Ajv and OpenAPI both read it). */
function discriminated<T extends TSchema[]>(branches: [...T], description: string) {
  return Type.Unsafe<Static<T[number]>>({
    type: 'object',
    required: ['type'],
    oneOf: branches,
    discriminator: { propertyName: 'type' },
    description,
  });
}

function questionSchemas(limits: DecisionLimits) {
  const noul = Type.Object(
    {
      type: Type.Literal('noul'),
      instructions: Guidance,
      criteria: Type.Optional(Type.Object({ true: Guidance, false: Guidance }, { additionalProperties: false })),
    },
    { additionalProperties: false },
  );
  const choice = Type.Object(
    {
      type: Type.Literal('choice'),
      instructions: Guidance,
      criteria: KeyedRecord(NAME, GuidanceOrNull, {
        minProperties: 1,
        maxProperties: limits.maxChoices,
        description: 'Choice label → guidance (or null); the keys are the choices',
      }),
    },
    { additionalProperties: false },
  );
  const score = Type.Object(
    {
      type: Type.Literal('score'),
      instructions: Guidance,
      criteria: Type.Array(Guidance, { minItems: 1, maxItems: limits.maxScoreLevels, description: 'Ordered levels, lowest first' }),
    },
    { additionalProperties: false },
  );
  return { noul, choice, score };
}

export function decisionsRequestSchema(limits: DecisionLimits) {
  const q = questionSchemas(limits);
  const question = discriminated([q.noul, q.choice, q.score], 'A question, by type');
  return Type.Object(
    {
      model: Type.String({ minLength: 1, maxLength: 256, description: 'A model id, or `@preset/<slug>` / `<model>@preset/<slug>`' }),
      preset: Type.Optional(
        Type.String({ minLength: 1, maxLength: 136, description: 'A preset whose model and provider preferences apply' }),
      ),
      state: Guidance,
      questions: KeyedRecord(NAME, question, {
        minProperties: 1,
        maxProperties: limits.maxQuestions,
      }),
      provider: Type.Optional(ProviderPreferences),
      ...attributionFields,
    },
    { additionalProperties: false },
  );
}

export const DecisionsRequestShape = decisionsRequestSchema(DEFAULT_DECISION_LIMITS);
const defaults = questionSchemas(DEFAULT_DECISION_LIMITS);
export const DecisionQuestion = discriminated([defaults.noul, defaults.choice, defaults.score], 'A question, by type');

const Probabilities = Type.Record(Type.String(), Type.Number());
export const DecisionAnswer = discriminated(
  [
    Type.Object({ type: Type.Literal('noul'), noul: Type.Number({ description: 'P(true)' }) }),
    Type.Object({
      type: Type.Literal('choice'),
      choice: Type.String(),
      confidence: Type.Optional(Type.Number()),
      probabilities: Type.Optional(Probabilities),
    }),
    Type.Object({
      type: Type.Literal('score'),
      score: Type.Number({ description: 'Expected level, 0 to n−1' }),
      confidence: Type.Optional(Type.Number()),
      probabilities: Type.Optional(Probabilities),
      legend: Type.Optional(Type.Record(Type.String(), Guidance)),
    }),
  ],
  'An answer, by type',
);

export const DecisionsResponse = Type.Object({
  id: Type.String(),
  model: Type.String({ description: 'Dated canonical model id' }),
  provider: Type.String({ description: 'The provider that answered (the one that answered most questions, if they were routed apart)' }),
  providers: Type.Optional(
    Type.Record(Type.String(), Type.String(), { description: "Each question's provider; present only when more than one answered" }),
  ),
  answers: Type.Record(Type.String(), DecisionAnswer),
  usage: Type.Object({ input_tokens: Type.Integer(), output_tokens: Type.Integer(), cost: Type.Number() }),
});
