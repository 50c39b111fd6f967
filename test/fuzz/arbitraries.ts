// fast-check arbitraries from JSON Schema: the OpenAPI document's schemas, which are the TypeBox
// schemas that validate each route, so the fuzz suite generates what the gateway declares it takes
// (and then breaks it on purpose).
import fc from 'fast-check';

type Schema = Record<string, any>;

const MAX_DEPTH = 4;

/** A value that should satisfy `schema` (cross-field rules aside). */
export function fromSchema(schema: Schema | undefined, depth = 0): fc.Arbitrary<unknown> {
  if (!schema || depth > MAX_DEPTH) return fc.constant(null);
  if ('const' in schema) return fc.constant(schema.const);
  if (Array.isArray(schema.enum)) return fc.constantFrom(...schema.enum);
  const branches = schema.anyOf ?? schema.oneOf;
  if (Array.isArray(branches)) return fc.oneof(...branches.map((b: Schema) => fromSchema(b, depth + 1)));
  if (Array.isArray(schema.type)) return fc.oneof(...schema.type.map((t: string) => fromSchema({ ...schema, type: t }, depth)));
  switch (schema.type) {
    case 'string': {
      if (schema.pattern) {
        const re = new RegExp(schema.pattern);
        const max = schema.maxLength ?? 40;
        return fc.stringMatching(re).filter((s) => s.length <= max && s.length >= (schema.minLength ?? 0));
      }
      if (schema.format === 'date-time')
        return fc.date({ min: new Date('2000-01-01'), max: new Date('2100-01-01'), noInvalidDate: true }).map((d) => d.toISOString());
      if (schema.format === 'uri') return fc.webUrl();
      return fc.string({ minLength: schema.minLength ?? 0, maxLength: Math.min(schema.maxLength ?? 20, 20) });
    }
    case 'integer': {
      const min = schema.minimum ?? (schema.exclusiveMinimum !== undefined ? Math.floor(schema.exclusiveMinimum) + 1 : -1000);
      const max =
        schema.maximum ?? (schema.exclusiveMaximum !== undefined ? Math.ceil(schema.exclusiveMaximum) - 1 : Math.max(min, 0) + 1000);
      return fc.integer({ min, max: Math.max(min, max) });
    }
    case 'number': {
      const min = schema.minimum ?? schema.exclusiveMinimum ?? -1000;
      const max = schema.maximum ?? schema.exclusiveMaximum ?? Math.max(min, 0) + 1000;
      return fc.double({
        min,
        max: Math.max(min, max),
        noNaN: true,
        noDefaultInfinity: true,
        minExcluded: schema.exclusiveMinimum !== undefined,
        maxExcluded: schema.exclusiveMaximum !== undefined,
      });
    }
    case 'boolean':
      return fc.boolean();
    case 'null':
      return fc.constant(null);
    case 'array':
      return fc.array(fromSchema(schema.items, depth + 1), {
        minLength: schema.minItems ?? 0,
        maxLength: Math.max(schema.minItems ?? 0, Math.min(schema.maxItems ?? 3, 3)),
      });
    case 'object': {
      const props: Record<string, Schema> = schema.properties ?? {};
      const required: string[] = schema.required ?? [];
      const known = Object.keys(props).length
        ? fc.record(Object.fromEntries(Object.entries(props).map(([k, s]) => [k, fromSchema(s, depth + 1)])), {
            requiredKeys: required.filter((k) => k in props),
          })
        : fc.constant({});
      const extra = schema.patternProperties
        ? (Object.values(schema.patternProperties)[0] as Schema)
        : typeof schema.additionalProperties === 'object'
          ? (schema.additionalProperties as Schema)
          : null;
      if (!extra) return known;
      const min = Math.min(schema.minProperties ?? 0, 3);
      const keyPattern = schema.propertyNames?.pattern ? new RegExp(schema.propertyNames.pattern) : null;
      return fc
        .tuple(
          known,
          fc.dictionary(
            fc.string({ minLength: 1, maxLength: 12 }).filter((k) => /^[A-Za-z0-9_]+$/.test(k) && (!keyPattern || keyPattern.test(k))),
            fromSchema(extra, depth + 1),
            { minKeys: min, maxKeys: Math.max(min, 2) },
          ),
        )
        .map(([k, d]) => ({ ...d, ...(k as object) }));
    }
    default:
      return fc.jsonValue({ maxDepth: 2 });
  }
}

/** Any JSON value of a type a field probably does not take. */
export const wrongValue: fc.Arbitrary<unknown> = fc.oneof(
  fc.integer(),
  fc.double(),
  fc.string({ maxLength: 8 }),
  fc.boolean(),
  fc.constant(null),
  fc.constant([]),
  fc.constant({}),
  fc.constant(-1),
  fc.constant(0),
  fc.constant(2 ** 53 + 1),
  fc.constant(''),
  fc.array(fc.integer(), { maxLength: 3 }),
);

/** Key names a careless or hostile client sends. */
export const hostileKey = fc.constantFrom(
  '__proto__',
  'constructor',
  'prototype',
  '$where',
  '$gt',
  'a.b',
  'nul\u0000key',
  'é',
  '🙂',
  '',
  'k'.repeat(5000),
);

/** Strings that stress storage, logs and parsers. */
export const hostileString = fc.constantFrom(
  '\u0000',
  'a\u0000b',
  '\ud800',
  '🙂'.repeat(100),
  'x'.repeat(100_000),
  '${SANDBOX_URL}',
  '{"$gt":""}',
  '<script>',
  '\r\n\r\nHTTP/1.1 200',
);

/** Path segments and query values: traversal, encodings, sizes. */
export const hostileSegment = fc.constantFrom(
  '..',
  '%2e%2e',
  '..%2F..%2Fetc%2Fpasswd',
  '%00',
  '%E0%A4%A',
  '%',
  'a'.repeat(5000),
  '%F0%9F%99%82',
  'batch_%24gt',
  ' ',
  '%20',
  '~',
  'null',
  '-1',
  '1e309',
);
