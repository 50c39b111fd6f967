// Provider routing preferences (interface §2.5): one definition for validation, types and OpenAPI.
import { Type, type Static } from '@sinclair/typebox';
import { QUANTIZATIONS } from '../catalog/schema';
import { Nullable, StringEnum } from '../../infrastructure/validation/types';

const Slugs = Nullable(Type.Array(Type.String({ minLength: 1, maxLength: 128 }), { maxItems: 64 }));

const SORT_BY = ['price', 'throughput', 'latency', 'exacto'] as const;
const Percentiles = (description: string) =>
  Type.Object(
    {
      p50: Type.Optional(Nullable(Type.Number({ minimum: 0 }))),
      p75: Type.Optional(Nullable(Type.Number({ minimum: 0 }))),
      p90: Type.Optional(Nullable(Type.Number({ minimum: 0 }))),
      p99: Type.Optional(Nullable(Type.Number({ minimum: 0 }))),
    },
    { additionalProperties: false, description },
  );

const PriceCap = Type.String({ pattern: '^\\d+(\\.\\d+)?$', description: 'USD amount as a decimal string' });

export const ProviderPreferences = Nullable(
  Type.Object(
    {
      allow_fallbacks: Type.Optional(Nullable(Type.Boolean({ description: 'default true' }))),
      data_collection: Type.Optional(Nullable(StringEnum(['allow', 'deny']))),
      enforce_distillable_text: Type.Optional(Nullable(Type.Boolean())),
      ignore: Type.Optional(Slugs),
      only: Type.Optional(Slugs),
      order: Type.Optional(Slugs),
      max_price: Type.Optional(
        Type.Object(
          {
            prompt: Type.Optional(PriceCap),
            completion: Type.Optional(PriceCap),
            request: Type.Optional(PriceCap),
            image: Type.Optional(PriceCap),
            audio: Type.Optional(PriceCap),
          },
          {
            additionalProperties: false,
            description: 'USD per million tokens (prompt, completion, audio prompt tokens), per request, or per image',
          },
        ),
      ),
      options: Type.Optional(
        Type.Record(Type.String(), Type.Record(Type.String(), Type.Unknown()), {
          description: "Per provider slug; only the chosen provider's are forwarded",
        }),
      ),
      preferred_max_latency: Type.Optional(Nullable(Type.Union([Type.Number({ minimum: 0 }), Percentiles('seconds')]))),
      preferred_min_throughput: Type.Optional(Nullable(Type.Union([Type.Number({ minimum: 0 }), Percentiles('tokens per second')]))),
      quantizations: Type.Optional(Nullable(Type.Array(StringEnum([...QUANTIZATIONS])))),
      require_parameters: Type.Optional(Nullable(Type.Boolean())),
      sort: Type.Optional(
        Nullable(
          Type.Union([
            StringEnum([...SORT_BY]),
            Type.Object(
              {
                by: Type.Optional(Nullable(StringEnum([...SORT_BY]))),
                partition: Type.Optional(Nullable(StringEnum(['model', 'none']))),
              },
              { additionalProperties: false },
            ),
          ]),
        ),
      ),
      zdr: Type.Optional(Nullable(Type.Boolean())),
    },
    { additionalProperties: false },
  ),
);

export type ProviderPreferences = Static<typeof ProviderPreferences>;
