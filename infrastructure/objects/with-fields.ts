// `{ ...base, ...fields }`, made the way Node 20's V8 makes fast. There a spread followed by further
// fields costs about 1.5 µs a field (a copy of a parsed request body given `stream: true`: 1.9 µs
// against 0.1 µs this way), and the proxied call's path made several such copies per request.

/** A shallow copy of `base` with `fields` set on it (theirs win), as the spread would make it. */
export function withFields<A extends object, B extends object>(base: A, fields: B): Omit<A, keyof B> & B {
  // A spread defines `__proto__` as an own field (JSON.parse makes one from `"__proto__"`); Object.assign
  // would set the copy's prototype instead.
  if (Object.hasOwn(base, '__proto__') || Object.hasOwn(fields, '__proto__')) return { ...base, ...fields };
  return Object.assign({}, base, fields);
}
