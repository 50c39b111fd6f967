// Gives every request an id (the caller's `x-request-id` when it is sane), echoes it, and logs
// one line per request with it.
import { randomUUID } from 'node:crypto';
import type Koa from 'koa';
import { PLAIN_REQUEST_ID, requestLogger, type Logger } from '../infrastructure/log';

export function requestContext(logger: Logger): Koa.Middleware {
  return async (ctx, next) => {
    const given = ctx.get('x-request-id');
    const requestId = PLAIN_REQUEST_ID.test(given) ? given : randomUUID();
    ctx.state.requestId = requestId;
    ctx.state.log = requestLogger(logger, requestId);
    ctx.set('x-request-id', requestId);
    const started = process.hrtime.bigint();
    try {
      await next();
    } finally {
      const ms = Number(process.hrtime.bigint() - started) / 1e6;
      ctx.state.log.info({ method: ctx.method, path: ctx.path, status: ctx.status, ms: Math.round(ms * 100) / 100 }, 'request');
    }
  };
}
