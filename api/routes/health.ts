// Liveness and readiness, outside /api/v1 and without auth, for load balancers and orchestrators.
import Router from '@koa/router';
import { ServiceUnavailableError } from '../../errors';
import type { AppDeps } from '../deps';

export function healthRoutes(deps: AppDeps): Router {
  const router = new Router();

  router.get('/healthz', (ctx) => {
    ctx.body = { status: 'ok' };
  });

  router.get('/readyz', async (ctx) => {
    const checks = await Promise.all([
      deps.store.ping().then(() => null, (e: Error) => `mongodb: ${e.message}`),
      deps.pingTemporal().then(() => null, (e: Error) => `temporal: ${e.message}`),
    ]);
    const failing = checks.filter((c): c is string => c !== null);
    if (failing.length) {
      throw new ServiceUnavailableError(`Not ready: ${failing.join('; ')}`, {
        mongodb: checks[0] === null ? 'ok' : 'unavailable',
        temporal: checks[1] === null ? 'ok' : 'unavailable',
      });
    }
    ctx.body = { status: 'ok', checks: { mongodb: 'ok', temporal: 'ok' }, decisions_execution: deps.decisions.mode };
  });

  return router;
}
