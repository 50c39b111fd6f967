// What can go wrong calling a provider, classified once so routing can decide whether to fall back
// and the API can map the final failure to the interface's statuses.
export type FailureKind =
  | 'http'
  | 'rate_limited'
  | 'overloaded'
  | 'timeout'
  | 'connection'
  | 'capacity'
  | 'invalid_response'
  | 'aborted'
  /** The request cannot be put in the provider's format (a translation refused it): never sent. */
  | 'refused';

export class UpstreamFailure extends Error {
  constructor(
    readonly kind: FailureKind,
    readonly provider: string,
    message: string,
    readonly status: number | null = null,
    readonly retryAfterMs: number | null = null,
  ) {
    super(message);
    this.name = 'UpstreamFailure';
  }

  /** Whether another endpoint (or a later retry) might succeed. Our own caller aborting is final. */
  get retryable(): boolean {
    return this.kind !== 'aborted';
  }
}

/** Retry-After as seconds or an HTTP date, in ms; null when absent or unreadable. */
export function parseRetryAfter(value: string | string[] | undefined, now = Date.now()): number | null {
  const v = Array.isArray(value) ? value[0] : value;
  if (!v) return null;
  if (/^\d+(\.\d+)?$/.test(v.trim())) return Math.round(Number(v) * 1000);
  const at = Date.parse(v);
  return Number.isNaN(at) ? null : Math.max(0, at - now);
}
