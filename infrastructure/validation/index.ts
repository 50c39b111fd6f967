// Ajv, set up once. Schemas are TypeBox definitions (also the TypeScript types and the OpenAPI
// components) compiled when routes are registered, never per request.
import Ajv, { type ErrorObject, type ValidateFunction } from 'ajv';
import addFormats from 'ajv-formats';
import type { TSchema, Static } from '@sinclair/typebox';
import { BadRequestError } from '../errors';
import { maxJsonLength } from './json-length';

function makeAjv(coerce: boolean, allErrors: boolean): Ajv {
  // strictNumbers: `strict: false` would otherwise let Infinity (JSON's 1e309) pass as an integer.
  const ajv = new Ajv({
    allErrors,
    strict: false,
    strictNumbers: true,
    discriminator: true,
    verbose: true,
    coerceTypes: coerce ? 'array' : false,
    useDefaults: coerce,
    // Ajv's optimising pass over the generated code took 40 % of compiling (every process compiles
    // every route's schemas at start) and bought nothing measurable: validating a chat completion
    // body takes 0.6-0.8 µs with it and without it.
    code: { optimize: false },
  });
  addFormats(ajv);
  ajv.addKeyword(maxJsonLength);
  return ajv;
}

/**
 * Bodies are checked by a validator that stops at the first invalid value, so its cost is bounded by
 * the schema whatever the input holds (collecting every error made Ajv build 400,000 of them, 0.2 s,
 * for 10⁵ bad messages). Only a body small enough to walk cheaply is checked again with every error
 * collected, for a report that names all its problems and the most specific first.
 */
const bodies = makeAjv(false, false);
const bodiesReported = makeAjv(false, true);
/** Query strings and path parameters arrive as text: coerce them ("10" → 10, one value → array). */
const params = makeAjv(true, true);

/** Values in a body above which only its first error is reported. */
const FULL_REPORT_MAX_NODES = 2_000;

/** True when `data` holds at most `max` values (a walk that stops as soon as it passes that). */
function smallerThan(data: unknown, max: number): boolean {
  let left = max;
  const stack: unknown[] = [data];
  while (stack.length) {
    const v = stack.pop();
    if (--left < 0) return false;
    if (!v || typeof v !== 'object') continue;
    const children = Array.isArray(v) ? v : Object.values(v);
    if (stack.length + children.length > left) return false;
    for (const x of children) stack.push(x);
  }
  return true;
}

/** `/questions/q1/criteria` → `questions.q1.criteria`; `/requests/3/body` → `requests[3].body`. */
function fieldPath(instancePath: string, extra?: string): string {
  const parts = instancePath
    .split('/')
    .slice(1)
    .map((p) => p.replace(/~1/g, '/').replace(/~0/g, '~'));
  if (extra !== undefined) parts.push(extra);
  let out = '';
  for (const p of parts) out += /^\d+$/.test(p) ? `[${p}]` : out ? `.${p}` : p;
  // A client's own key names are echoed back and logged: keep a hostile one short.
  return out.length > 200 ? `${out.slice(0, 200)}…` : out;
}

function describe(e: ErrorObject, root: string): { field: string; message: string } {
  // A key that fails its `propertyNames` schema: named, since the object's path alone says not which.
  const key = (e as ErrorObject & { propertyName?: string }).propertyName;
  if (key !== undefined) {
    const shown = key.length > 40 ? `${JSON.stringify(key.slice(0, 40))}…` : JSON.stringify(key);
    return { field: fieldPath(e.instancePath) || root, message: `key ${shown}: ${e.message ?? 'is invalid'}` };
  }
  switch (e.keyword) {
    case 'required':
      return {
        field: fieldPath(e.instancePath, (e.params as { missingProperty: string }).missingProperty) || root,
        message: 'is required',
      };
    case 'additionalProperties':
      return {
        field: fieldPath(e.instancePath, (e.params as { additionalProperty: string }).additionalProperty) || root,
        message: 'is not an allowed field',
      };
    case 'discriminator': {
      // Name the allowed tags, read from the union's branches.
      const { tag, tagValue } = e.params as { tag: string; tagValue?: unknown };
      const branches = (e.parentSchema as { oneOf?: { properties?: Record<string, { const?: string }> }[] })?.oneOf ?? [];
      const tags = branches
        .map((b) => b.properties?.[tag]?.const)
        .filter(Boolean)
        .map((t) => JSON.stringify(t));
      if (tagValue === undefined) return { field: fieldPath(e.instancePath, tag) || root, message: 'is required' };
      return {
        field: fieldPath(e.instancePath, tag) || root,
        message: tags.length ? `must be one of ${tags.join(', ')}` : 'is not a known type',
      };
    }
    case 'const': {
      const description = (e.parentSchema as { description?: string })?.description;
      const allowed = JSON.stringify((e.params as { allowedValue: unknown }).allowedValue);
      return { field: fieldPath(e.instancePath) || root, message: `must be ${allowed}${description ? ` (${description})` : ''}` };
    }
    case 'not': // a field refused whatever its value: its description says why
      return {
        field: fieldPath(e.instancePath) || root,
        message: `is not accepted: ${(e.parentSchema as { description?: string })?.description ?? 'never allowed here'}`,
      };
    case 'enum':
      return {
        field: fieldPath(e.instancePath) || root,
        message: `must be one of ${(e.params as { allowedValues: unknown[] }).allowedValues.map((v) => JSON.stringify(v)).join(', ')}`,
      };
    default:
      return { field: fieldPath(e.instancePath) || root, message: e.message ?? 'is invalid' };
  }
}

/** The most useful error first: a concrete one over a union's summary, the deepest field first. */
function rank(errors: ErrorObject[]): ErrorObject[] {
  const concrete = errors.filter((e) => !['anyOf', 'oneOf', 'if', 'not', 'propertyNames'].includes(e.keyword));
  const pool = concrete.length ? concrete : errors;
  // Deepest field first; at equal depth a union branch's bare type mismatch ("must be null") says
  // less than the branch that matched the type and then failed on something specific.
  // (A missing or unexpected property names a field one level below its instancePath.)
  const depth = (e: ErrorObject) =>
    e.instancePath.split('/').length + (e.keyword === 'required' || e.keyword === 'additionalProperties' ? 1 : 0);
  // At equal depth: a specific complaint (enum, const, range …) over a missing field over a type mismatch.
  const weight = (e: ErrorObject) =>
    depth(e) * 4 + (e.keyword === 'type' ? 0 : e.keyword === 'required' || e.keyword === 'additionalProperties' ? 1 : 2);
  return [...pool].sort((a, b) => weight(b) - weight(a));
}

/** "must be string, object or array" for a list of types. */
function mustBe(types: string[]): string {
  return `must be ${types.length > 1 ? `${types.slice(0, -1).join(', ')} or ${types[types.length - 1]}` : types[0]}`;
}

/**
 * Type errors about one value read best as one list: "must be string, object or array", whether the
 * schema gave a list of types or several union branches each refused the value by its type.
 */
function mergeTypeErrors(errors: ErrorObject[]): ErrorObject[] {
  const out: ErrorObject[] = [];
  // One lookup per error, not a search of those kept: a body with 10⁵ bad items must stay linear.
  const typeAt = new Map<string, ErrorObject>();
  for (const e of errors) {
    if (e.keyword !== 'type') {
      out.push(e);
      continue;
    }
    const prior = typeAt.get(e.instancePath);
    const types = [...(prior ? String(prior.params.type).split(',') : []), ...String(e.params.type).split(',')].filter(
      (t, i, a) => a.indexOf(t) === i,
    );
    const merged = { ...e, params: { ...e.params, type: types.join(',') }, message: mustBe(types) };
    if (prior) Object.assign(prior, merged);
    else {
      typeAt.set(e.instancePath, merged);
      out.push(merged);
    }
  }
  return out;
}

export interface Validator<T> {
  (data: unknown): T;
  schema: TSchema;
  /** Whether the data is valid, without building a report of why not (a few µs, not tens). */
  valid(data: unknown): boolean;
}

function build<S extends TSchema>(ajv: Ajv, schema: S, root: string, reporting?: Ajv): Validator<Static<S>> {
  const check: ValidateFunction = ajv.compile(schema);
  // Compiled on the first invalid body, not at start: most schemas never see one.
  let reporter: ValidateFunction | null = null;
  const errorsOf = (data: unknown): ErrorObject[] => {
    if (!reporting || !smallerThan(data, FULL_REPORT_MAX_NODES)) return check.errors ?? [];
    reporter ??= reporting.compile(schema);
    reporter(data);
    return reporter.errors ?? check.errors ?? [];
  };
  const validator = ((data: unknown) => {
    if (check(data)) {
      // Ajv's coercion turns "1e309" into Infinity and lets it through its number checks.
      if (ajv === params)
        for (const [k, v] of Object.entries(data as object))
          if (typeof v === 'number' && !Number.isFinite(v)) throw new BadRequestError(`${root}.${k}: must be a finite number`);
      return data as Static<S>;
    }
    const errors = mergeTypeErrors(rank(errorsOf(data))).map((e) => describe(e, root));
    const seen = new Set<string>();
    const unique = errors.filter((e) => !seen.has(`${e.field}${e.message}`) && seen.add(`${e.field}${e.message}`));
    const first = unique[0] ?? { field: root, message: 'is invalid' };
    throw new BadRequestError(`${first.field}: ${first.message}`, { errors: unique.slice(0, 20) });
  }) as Validator<Static<S>>;
  validator.schema = schema;
  validator.valid = (data) => {
    if (ajv !== params) return check(data) === true;
    try {
      validator(data); // and its finite-number check
      return true;
    } catch (err) {
      if (err instanceof BadRequestError) return false;
      throw err;
    }
  };
  return validator;
}

export const compileBody = <S extends TSchema>(schema: S) => build(bodies, schema, 'body', bodiesReported);
export const compileQuery = <S extends TSchema>(schema: S) => build(params, schema, 'query');
export const compileParams = <S extends TSchema>(schema: S) => build(params, schema, 'path');
