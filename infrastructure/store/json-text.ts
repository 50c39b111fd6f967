// Caller-supplied objects (trace metadata, batch metadata, preset configs, batch line bodies) are
// stored as their JSON text. MongoDB refuses some valid JSON (keys that start with `$`, like a JSON
// Schema's `$ref`, or contain `.` or NUL) and FerretDB also refuses arrays nested in arrays (token
// inputs `[[1, 2, 3]]`); a gateway must not refuse a valid request for its shape, nor fail after a
// paid provider call when it records it.

export function toJsonText(value: unknown): string {
  return JSON.stringify(value);
}

/** The stored value as an object again. */
export function fromJsonText<T>(stored: string): T {
  return JSON.parse(stored) as T;
}
