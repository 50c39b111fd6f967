// The one place where a thrown value becomes an HTTP status and the interface's error envelope.
import type Koa from 'koa';
import { GatewayError, InternalError, RateLimitedError, ServiceUnavailableError, errorFromStatus } from '../infrastructure/errors';
import { isDatabaseFull, isDatabaseUnavailable } from '../infrastructure/store';
import { isOrchestrationUnavailable, orchestrationUnavailable } from '../infrastructure/temporal/failures';
import type { Logger } from '../infrastructure/log';
import { clientClosed } from './request-signal';
import { dropUnread } from './lingering-close';

/** Not an HTTP status a client sees: what the metrics and the log count a request whose client left as. */
export const CLIENT_CLOSED = 499;

export interface ErrorEnvelope {
  error: { code: number; message: string; metadata: Record<string, unknown> | null };
  user_id: string | null;
}

/**
 * Errors Koa and the router throw carry an HTTP status: a client error keeps it. A database that
 * cannot be reached, or whose disk is full, or a Temporal that does not answer (a batch's cancel
 * signal), is a 503 (try again); anything else is a 500.
 */
export function normalize(err: unknown): GatewayError {
  if (err instanceof GatewayError) return err;
  if (isDatabaseUnavailable(err)) return new ServiceUnavailableError('The database is unavailable right now; try again shortly');
  if (isDatabaseFull(err))
    return new ServiceUnavailableError('The database cannot store anything more right now (its disk is full); try again later');
  if (isOrchestrationUnavailable(err)) return orchestrationUnavailable();
  const e = err as { status?: number; expose?: boolean; message?: string };
  if (typeof e?.status === 'number' && e.status >= 400 && e.status < 500 && e.expose)
    return errorFromStatus(e.status, short(e.message ?? 'Bad request'));
  return new InternalError('Internal server error');
}

/** Messages can carry what a client sent: bounded in logs and answers. */
function short(text: string, max = 300): string {
  return text.length > max ? `${text.slice(0, max)}… (${text.length} characters)` : text;
}

export function envelope(err: GatewayError, userId: string | null = null): ErrorEnvelope {
  return { error: { code: err.status, message: err.message, metadata: err.metadata }, user_id: userId };
}

export function errorMiddleware(): Koa.Middleware {
  return async (ctx, next) => {
    try {
      await next();
    } catch (raw) {
      const log: Logger = ctx.state.log;
      if (clientClosed(ctx)) {
        // Whatever failed after the client left (its cancelled upstream call, a write) is not an error of ours.
        log.info({ reason: raw instanceof Error ? raw.message : String(raw) }, 'client closed the request');
        ctx.status = CLIENT_CLOSED;
        return;
      }
      const err = normalize(raw);
      if (isDatabaseUnavailable(raw)) {
        log.warn({ reason: (raw as Error).message.slice(0, 300) }, 'database unavailable');
      } else if (isDatabaseFull(raw)) {
        log.error({ reason: (raw as Error).message.slice(0, 300) }, 'database disk full');
      } else if (err.status >= 500 && !(raw instanceof GatewayError)) {
        // Details stay in the log; the client gets the generic message.
        log.error({ err: raw }, 'unhandled error');
      } else {
        log.debug({ status: err.status, message: short(err.message) }, 'request failed');
      }
      if (err instanceof RateLimitedError) ctx.set('Retry-After', String(err.retryAfterSeconds));
      ctx.status = err.status;
      ctx.body = envelope(err, ctx.state.userId ?? null);
    }
    // Answered before its body was read (refused, or a route that reads none): dropped with a bound.
    if (!ctx.req.complete) dropUnread(ctx.req);
  };
}
