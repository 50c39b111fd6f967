// Runs a route plan: tries its endpoints in order within each provider's concurrency limit, falls
// back on retryable failures, honours a short Retry-After on the last endpoint, records every
// attempt in the live stats, and turns the final failure into the interface's status.
import type { Endpoint } from '../catalog';
import {
  GatewayError,
  RateLimitedError,
  ServiceUnavailableError,
  UpstreamError,
  UpstreamOverloadedError,
  UpstreamTimeoutError,
} from '../../infrastructure/errors';
import type { ProviderResponse } from './endpoint-call';
import { UpstreamFailure } from '../../infrastructure/providers/failure';
import type { ProviderLimiter } from '../../infrastructure/providers/limiter';
import type { RoutePlan } from './engine';
import type { LiveStats, Sample } from './stats';
import { sleep } from '../../infrastructure/concurrency/sleep';
import type { UpstreamObserver } from '../../infrastructure/metrics';

export interface Attempt {
  provider: string;
  endpoint: string;
  kind: string;
  status: number | null;
  message: string;
}

export interface Executed<T = ProviderResponse> {
  endpoint: Endpoint;
  response: T;
  attempts: Attempt[];
  /** Gives back the provider's concurrency slot: a no-op unless `holdSlot` kept it for the caller. */
  release: () => void;
}

export interface ExecuteOptions<T = ProviderResponse> {
  limiter: ProviderLimiter;
  stats?: LiveStats;
  signal?: AbortSignal;
  /** How long to wait for a provider's concurrency slot before moving on (default: its timeout). */
  queueWaitMs?: number;
  /** The longest Retry-After worth waiting for on the last endpoint. */
  maxRetryAfterMs?: number;
  /** What a success adds to the live stats; null when the caller records it later (a stream, at its end). */
  measure?: (response: T) => Sample | null;
  /** Keep the slot after a success (a stream holds it until it ends) and hand its release to the caller. */
  holdSlot?: boolean;
  /** Told of every attempt and fallback (metrics). */
  observer?: UpstreamObserver;
  /** Whose call it is: a freed provider slot goes to the waiting workspace holding the fewest (see the limiter). */
  workspaceId?: string;
}

const measureResponse = (r: unknown): Sample => {
  const p = r as ProviderResponse;
  return { ok: true, latencyMs: p.latencyMs, outputTokens: p.usage.output_tokens };
};

/** The final failure as the interface's status, naming the provider and what it said. */
export function failureToError(last: UpstreamFailure, attempts: Attempt[]): GatewayError {
  const metadata = { provider_name: last.provider, upstream_status: last.status, upstream_message: last.message, attempts };
  const text = `${last.provider}: ${last.message}`;
  switch (last.kind) {
    case 'rate_limited':
      return new RateLimitedError(
        `Provider rate limited the request (${text})`,
        Math.max(1, Math.ceil((last.retryAfterMs ?? 1000) / 1000)),
        metadata,
      );
    case 'overloaded':
      return new UpstreamOverloadedError(`Provider is overloaded (${text})`, metadata);
    case 'timeout':
      return new UpstreamTimeoutError(`Provider timed out (${text})`, metadata);
    case 'capacity':
      return new ServiceUnavailableError(`No provider capacity available (${text})`, metadata);
    default:
      return new UpstreamError(`Provider error (${text})`, metadata);
  }
}

export async function executePlan<T = ProviderResponse>(
  plan: RoutePlan,
  call: (endpoint: Endpoint, signal: AbortSignal | undefined) => Promise<T>,
  opts: ExecuteOptions<T>,
): Promise<Executed<T>> {
  const attempts: Attempt[] = [];
  const measure = opts.measure ?? measureResponse;
  const maxRetryAfter = opts.maxRetryAfterMs ?? 5_000;
  let last: UpstreamFailure | null = null;
  /** A request some endpoint's format refused (a 400 naming the field): what the caller hears if every endpoint failed that way. */
  let refusal: GatewayError | null = null;
  for (let i = 0; i < plan.endpoints.length; i++) {
    const e = plan.endpoints[i];
    const isLast = i === plan.endpoints.length - 1;
    for (let retry = 0; retry < 2; retry++) {
      let release: (() => void) | null = null;
      let startedAt = 0;
      try {
        release = await opts.limiter.acquire(e.provider, {
          waitMs: opts.queueWaitMs ?? e.provider.timeout_ms,
          signal: opts.signal,
          workspaceId: opts.workspaceId,
          stream: opts.holdSlot === true,
        });
        startedAt = performance.now();
        const response = await call(e, opts.signal);
        opts.observer?.call(e.provider.slug, e.model.canonicalId, 'ok', (performance.now() - startedAt) / 1000);
        const sample = measure(response);
        if (sample) opts.stats?.record(e.key, sample);
        if (opts.holdSlot) {
          const kept = release;
          release = null;
          return { endpoint: e, response, attempts, release: kept };
        }
        return { endpoint: e, response, attempts, release: () => undefined };
      } catch (err) {
        if (err instanceof GatewayError && err.status < 500) refusal = err; // the request, not the provider: no fallback can send it as it is
        const f =
          err instanceof UpstreamFailure
            ? err
            : err instanceof GatewayError && err.status < 500
              ? new UpstreamFailure('refused', e.provider.slug, err.message, err.status)
              : new UpstreamFailure('invalid_response', e.provider.slug, (err as Error).message ?? String(err));
        last = f;
        attempts.push({ provider: e.provider.slug, endpoint: e.tag, kind: f.kind, status: f.status, message: f.message });
        if (f.kind !== 'capacity' && f.kind !== 'aborted' && f.kind !== 'refused')
          opts.stats?.record(e.key, { ok: false, latencyMs: 0, outputTokens: 0 });
        if (startedAt) opts.observer?.call(e.provider.slug, e.model.canonicalId, f.kind, (performance.now() - startedAt) / 1000);
        if (!f.retryable || opts.signal?.aborted) throw failureToError(f, attempts);
        if (!isLast) opts.observer?.fallback(e.model.canonicalId);
        // Nowhere else to go: a short Retry-After on the last endpoint is worth one wait.
        const waitable =
          isLast &&
          retry === 0 &&
          f.retryAfterMs !== null &&
          f.retryAfterMs <= maxRetryAfter &&
          (f.kind === 'rate_limited' || f.kind === 'overloaded' || f.status === 503);
        if (!waitable) break;
        await sleep(f.retryAfterMs!, opts.signal);
      } finally {
        release?.();
      }
    }
  }
  if (refusal && last?.kind === 'refused') throw refusal;
  throw failureToError(last ?? new UpstreamFailure('capacity', 'none', 'no endpoint to try'), attempts);
}
