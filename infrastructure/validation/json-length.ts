// `x-maxJsonLength`: a bound on a value's size as JSON text, for free-form values the gateway keeps or
// forwards with every call (a request's trace metadata is stored in its usage record and sent with
// its span), where a schema of their shape cannot bound them.
import type { KeywordDefinition, SchemaValidateFunction } from 'ajv';

/**
 * Whether `value` takes at most `max` characters as JSON. The walk stops as soon as it has counted
 * more, so a huge value costs no more than a small one; strings are counted without their escapes,
 * never more than JSON has, and a value that passes is measured exactly.
 */
export function jsonLengthAtMost(value: unknown, max: number): boolean {
  let count = 0;
  const stack: unknown[] = [value];
  while (stack.length) {
    const v = stack.pop();
    if (typeof v === 'string') count += v.length + 2;
    else if (v === null || typeof v !== 'object') count += String(v).length;
    else if (Array.isArray(v)) {
      count += 1 + Math.max(v.length, 1);
      for (const x of v) stack.push(x);
    } else {
      const keys = Object.keys(v);
      count += 1 + Math.max(keys.length, 1);
      for (const k of keys) {
        count += k.length + 3;
        stack.push((v as Record<string, unknown>)[k]);
      }
    }
    if (count > max) return false;
  }
  return JSON.stringify(value).length <= max;
}

const validate: SchemaValidateFunction = function maxJsonLength(max: number, data: unknown) {
  if (jsonLengthAtMost(data, max)) return true;
  validate.errors = [{ keyword: 'x-maxJsonLength', message: `must NOT be longer than ${max} characters as JSON`, params: { limit: max } }];
  return false;
};

export const maxJsonLength: KeywordDefinition = { keyword: 'x-maxJsonLength', schemaType: 'number', errors: true, validate };
