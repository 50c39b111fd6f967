// Times every request into the HTTP histogram, labelled by route template (never the raw path, so
// unknown paths cannot grow the label set), and counts credit refusals.
import type Koa from 'koa';
import type { Metrics } from '../infrastructure/metrics';
import { CLIENT_CLOSED } from './errors';
import { clientClosed } from './request-signal';

export function httpMetrics(metrics: Metrics): Koa.Middleware {
  return async (ctx, next) => {
    const started = process.hrtime.bigint();
    try {
      await next();
    } finally {
      const route = (ctx as Koa.Context & { _matchedRoute?: string })._matchedRoute ?? 'unmatched';
      const seconds = Number(process.hrtime.bigint() - started) / 1e9;
      // A stream whose client left had its 200 sent already: it counts as closed by the client too.
      const status = clientClosed(ctx) ? CLIENT_CLOSED : ctx.status;
      metrics.httpRequests.observe({ method: ctx.method, route: String(route), status: String(status) }, seconds);
      if (ctx.status === 402) metrics.paymentRequired.inc();
    }
  };
}
