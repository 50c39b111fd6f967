// The one place where a thrown value becomes an HTTP status and the interface's error envelope.
import type Koa from 'koa';
import {
  GatewayError, BadRequestError, InternalError, PayloadTooLargeError, RateLimitedError,
} from '../errors';
import type { Logger } from '../log';

export interface ErrorEnvelope {
  error: { code: number; message: string; metadata: Record<string, unknown> | null };
  user_id: string | null;
}

/** Errors thrown by Koa's body parser and friends carry a status; give them our classes. */
function normalize(err: unknown): GatewayError {
  if (err instanceof GatewayError) return err;
  const e = err as { status?: number; type?: string; message?: string };
  if (e?.status === 413 || e?.type === 'entity.too.large') {
    return new PayloadTooLargeError('Request body is larger than the configured limit');
  }
  if (e?.type === 'entity.parse.failed' || (e?.status === 400 && /json/i.test(e?.message ?? ''))) {
    return new BadRequestError('Request body is not valid JSON');
  }
  if (e?.status === 415 || e?.type === 'encoding.unsupported' || e?.type === 'charset.unsupported') {
    return new BadRequestError(e.message ?? 'Unsupported request encoding');
  }
  return new InternalError('Internal server error');
}

export function envelope(err: GatewayError, userId: string | null = null): ErrorEnvelope {
  return { error: { code: err.status, message: err.message, metadata: err.metadata }, user_id: userId };
}

export function errorMiddleware(): Koa.Middleware {
  return async (ctx, next) => {
    try {
      await next();
    } catch (raw) {
      const err = normalize(raw);
      const log: Logger = ctx.state.log;
      if (err.status >= 500 && !(raw instanceof GatewayError)) {
        // Details stay in the log; the client gets the generic message.
        log.error({ err: raw }, 'unhandled error');
      } else {
        log.debug({ status: err.status, message: err.message }, 'request failed');
      }
      if (err instanceof RateLimitedError) ctx.set('Retry-After', String(err.retryAfterSeconds));
      ctx.status = err.status;
      ctx.body = envelope(err, ctx.state.userId ?? null);
    }
  };
}
