// GET /metrics for Prometheus: open by default, behind a bearer token when METRICS_TOKEN is set;
// served by the API or, with METRICS_PORT, on a port of its own (which a worker alone can serve too).
import { createHash, timingSafeEqual } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import Koa from 'koa';
import Router from '@koa/router';
import { UnauthorizedError } from '../../infrastructure/errors';
import type { Metrics } from '../../infrastructure/metrics';
import type { Logger } from '../../infrastructure/log';
import { bearerToken } from '../auth';
import { errorMiddleware } from '../errors';

const digest = (s: string) => createHash('sha256').update(s).digest();

export function metricsRoutes(metrics: Metrics, token: string | null): Router {
  const router = new Router();
  router.get('/metrics', async (ctx) => {
    if (token) {
      const given = bearerToken(ctx.get('authorization')) ?? '';
      if (!timingSafeEqual(digest(given), digest(token))) throw new UnauthorizedError('Metrics need Authorization: Bearer <METRICS_TOKEN>');
    }
    ctx.type = metrics.contentType;
    ctx.body = await metrics.text();
  });
  return router;
}

/** /metrics alone on its own port. */
export async function startMetricsServer(
  metrics: Metrics,
  opts: { token: string | null; host: string; port: number; logger: Logger },
): Promise<{ url: string; close(): Promise<void> }> {
  const { token, host, port, logger } = opts;
  const app = new Koa();
  app.silent = true;
  app.use(async (ctx, next) => {
    ctx.state.log = logger;
    await next();
  });
  app.use(errorMiddleware());
  app.use(metricsRoutes(metrics, token).routes() as Koa.Middleware);
  const server = http.createServer(app.callback());
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve());
  });
  const addr = server.address() as AddressInfo;
  return {
    url: `http://${host}:${addr.port}/metrics`,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}
