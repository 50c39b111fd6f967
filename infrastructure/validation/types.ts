// Schemas shared by several areas. Each is at once the Ajv schema, the TypeScript type (Static) and
// an OpenAPI component.
import { Type, type TSchema, type TUnsafe } from '@sinclair/typebox';

/** A string enum as plain JSON Schema `enum`, so a bad value reads "must be one of …". */
export function StringEnum<T extends string[]>(values: [...T], options: Record<string, unknown> = {}): TUnsafe<T[number]> {
  return Type.Unsafe<T[number]>({ type: 'string', enum: values, ...options });
}

/**
 * An object of caller-chosen keys whose names are checked too. TypeBox's `Type.Record` puts a string
 * key's constraints nowhere Ajv looks (a key pattern becomes a `patternProperties` that other keys
 * simply bypass): the key's schema goes in `propertyNames`, and every value is checked.
 */
export function KeyedRecord<V extends TSchema>(key: Record<string, unknown>, value: V, options: Record<string, unknown> = {}) {
  return Type.Record(Type.String(), value, { ...options, propertyNames: { type: 'string', ...key } });
}

/** A schema that also accepts null. */
export const Nullable = <T extends TSchema>(t: T) => Type.Union([t, Type.Null()]);

/** A page of a list read by cursor, as OpenAI's lists are: `after=<last_id>` asks for the next. */
export const CursorPage = <T extends TSchema>(item: T) =>
  Type.Object({
    object: Type.Literal('list'),
    data: Type.Array(item),
    first_id: Nullable(Type.String()),
    last_id: Nullable(Type.String()),
    has_more: Type.Boolean(),
  });

/** A CursorPage's body; `last` is the cursor for the next page, the last item's id unless told. */
export function cursorPage<T extends { id: string }>(data: T[], hasMore: boolean, last: string | null = data[data.length - 1]?.id ?? null) {
  return { object: 'list' as const, data, first_id: data[0]?.id ?? null, last_id: last, has_more: hasMore };
}

export const ErrorEnvelope = Type.Object(
  {
    error: Type.Object({
      code: Type.Integer({ description: 'Equals the HTTP status' }),
      message: Type.String(),
      metadata: Type.Union([Type.Record(Type.String(), Type.Unknown()), Type.Null()]),
    }),
    user_id: Type.Union([Type.String(), Type.Null()]),
  },
  { $id: 'ErrorEnvelope' },
);

const SessionId = Type.String({ maxLength: 256, description: 'Groups related requests; never sent to the provider' });
const EndUser = Type.String({ maxLength: 256 });

/** The most a trace config may take as JSON: it is kept in the call's usage record and sent with its span. */
export const TRACE_MAX_JSON_LENGTH = 16_384;

const TraceConfig = Type.Object(
  {
    trace_id: Type.Optional(Type.String()),
    trace_name: Type.Optional(Type.String()),
    span_name: Type.Optional(Type.String()),
    generation_name: Type.Optional(Type.String()),
    parent_span_id: Type.Optional(Type.String()),
  },
  {
    additionalProperties: true,
    'x-maxJsonLength': TRACE_MAX_JSON_LENGTH,
    description: `Observability metadata; extra keys pass through as custom metadata. At most ${TRACE_MAX_JSON_LENGTH} characters as JSON`,
  },
);

/** Who and what a call is for, as every request that calls a model may say it: kept in its usage record. */
export const attributionFields = {
  session_id: Type.Optional(SessionId),
  user: Type.Optional(EndUser),
  trace: Type.Optional(TraceConfig),
};

export const Timestamp = Type.String({ format: 'date-time' });
