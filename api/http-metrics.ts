// Times every request into the HTTP histogram, labelled by route template (never the raw path, so
// unknown paths cannot grow the label set), and counts credit refusals.
import type Koa from 'koa';
import type { Metrics } from '../metrics';

export function httpMetrics(metrics: Metrics): Koa.Middleware {
  return async (ctx, next) => {
    const started = process.hrtime.bigint();
    try {
      await next();
    } finally {
      const route = (ctx as Koa.Context & { _matchedRoute?: string })._matchedRoute ?? 'unmatched';
      const seconds = Number(process.hrtime.bigint() - started) / 1e9;
      metrics.httpRequests.observe({ method: ctx.method, route: String(route), status: String(ctx.status) }, seconds);
      if (ctx.status === 402) metrics.paymentRequired.inc();
    }
  };
}
