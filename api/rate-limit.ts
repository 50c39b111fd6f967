// Applies the per-key limit and reports it on every authenticated response.
import type Koa from 'koa';
import { RateLimitedError } from '../infrastructure/errors';
import type { AppDeps } from './deps';
import type { AuthContext } from './auth';

export function rateLimit(deps: AppDeps): Koa.Middleware {
  return async (ctx, next) => {
    const { keyId } = ctx.state.auth as AuthContext;
    const d = await deps.rateLimiter.take(keyId);
    ctx.set('X-RateLimit-Limit', String(d.limit));
    ctx.set('X-RateLimit-Remaining', String(d.remaining));
    ctx.set('X-RateLimit-Reset', String(d.resetAt));
    if (d.unchecked) deps.metrics.rateUnchecked.inc();
    if (!d.allowed) {
      deps.metrics.rateLimited.inc();
      throw new RateLimitedError(
        `Rate limit exceeded: ${d.limit} requests per ${deps.rateLimiter.windowSeconds}s for this key`,
        d.retryAfterSeconds,
        {
          limit: d.limit,
          window_seconds: deps.rateLimiter.windowSeconds,
          reset_at: d.resetAt,
        },
      );
    }
    await next();
  };
}
