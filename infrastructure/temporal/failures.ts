// Gateway errors crossing Temporal: an activity turns one into a non-retryable ApplicationFailure
// carrying its status; the API turns the workflow failure back into the same error class.
import { ApplicationFailure, CancelledFailure, TerminatedFailure, TimeoutFailure } from '@temporalio/common';
import { errorFromStatus, GatewayError, InternalError, RateLimitedError, ServiceUnavailableError } from '../errors';

import { GATEWAY_ERROR_TYPE, gatewayFailure, type GatewayFailureDetails } from '../../workflows/shared';

/** For activities: gateway errors become final failures; anything else stays retryable. */
export function toActivityFailure(err: unknown): unknown {
  if (!(err instanceof GatewayError)) return err;
  return gatewayFailure(err.message, {
    status: err.status,
    metadata: err.metadata,
    ...(err instanceof RateLimitedError ? { retryAfterSeconds: err.retryAfterSeconds } : {}),
  });
}

/**
 * For clients: the gateway error a workflow failed with, or a 503 when Temporal itself failed or
 * the run was ended from outside (an operator, its execution timeout).
 */
export function fromWorkflowFailure(err: unknown): GatewayError {
  if (err instanceof GatewayError) return err;
  for (let e: any = err; e; e = e.cause) {
    if (e instanceof ApplicationFailure && e.type === GATEWAY_ERROR_TYPE) {
      const d = (e.details?.[0] ?? {}) as GatewayFailureDetails;
      if (d.status === 429) return new RateLimitedError(e.message, d.retryAfterSeconds ?? 1, d.metadata);
      return errorFromStatus(d.status ?? 500, e.message, d.metadata ?? null);
    }
    if (e instanceof TimeoutFailure) return new ServiceUnavailableError('The run did not finish in time; try again');
  }
  if (wasStopped(err)) {
    return new ServiceUnavailableError('The run was stopped before it answered (terminated or cancelled in Temporal); try again');
  }
  return isOrchestrationUnavailable(err) ? orchestrationUnavailable() : new InternalError('Internal server error');
}

/** A run ended from outside: terminated or cancelled (an operator, the Web UI, the CLI). */
export function wasStopped(err: unknown): boolean {
  for (let e: any = err; e; e = e.cause) if (e instanceof TerminatedFailure || e instanceof CancelledFailure) return true;
  return false;
}

/** Temporal did not answer a call (down, frozen, unreachable): the client may try again. */
export function isOrchestrationUnavailable(err: unknown): boolean {
  const name = (err as Error)?.name ?? '';
  return /Timeout|Connection|Unavailable|ServiceError/i.test(name) || /UNAVAILABLE|DEADLINE/i.test(String((err as Error)?.message));
}

export const orchestrationUnavailable = () => new ServiceUnavailableError('The orchestration service is unavailable; try again');

/**
 * `call`'s outcome, or the 503 of a Temporal that does not answer once `ms` have passed without one
 * (the client's own wait is 30 s). The call may still land later: only for calls whose late
 * landing is harmless.
 */
export async function answeredWithin<T>(call: Promise<T>, ms: number): Promise<T> {
  call.catch(() => undefined); // given up on, it may still fail
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      call,
      new Promise<never>((_, reject) => (timer = setTimeout(() => reject(orchestrationUnavailable()), ms))),
    ]);
  } finally {
    clearTimeout(timer);
  }
}
