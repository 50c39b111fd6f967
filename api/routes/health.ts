// Liveness and readiness, outside /api/v1 and without auth, for load balancers and orchestrators.
import Router from '@koa/router';
import { ServiceUnavailableError } from '../../infrastructure/errors';
import type { AppDeps } from '../deps';

/** /readyz answers within a second, whatever is down. */
const READY_WITHIN_MS = 800;

export function healthRoutes(deps: AppDeps): Router {
  const router = new Router();

  router.get('/healthz', (ctx) => {
    ctx.body = { status: 'ok' };
  });

  // Whatever has not answered within READY_WITHIN_MS counts as down: a probe must not wait out
  // a driver's reconnect (which took 6-8 s with a dependency gone).
  const within = (p: Promise<unknown>) =>
    Promise.race([
      p,
      new Promise((_, reject) => setTimeout(() => reject(new Error(`no answer within ${READY_WITHIN_MS} ms`)), READY_WITHIN_MS).unref()),
    ]);
  const pings = () =>
    Promise.all([
      within(deps.store.ping(READY_WITHIN_MS)).then(
        () => null,
        (e: Error) => `mongodb: ${e.message}`,
      ),
      within(deps.pingTemporal()).then(
        () => null,
        (e: Error) => `temporal: ${e.message}`,
      ),
    ]);
  // Probes arriving while a check is in flight share it: /readyz is unauthenticated, and a flood of
  // it (1,900 req/s) sent each to MongoDB and Temporal, cutting another workspace's chat calls from
  // 1,500 to 250 req/s. A shared answer is at most one check (under a second) old.
  let inFlight: ReturnType<typeof pings> | null = null;

  router.get('/readyz', async (ctx) => {
    const checks = await (inFlight ??= pings().finally(() => (inFlight = null)));
    // Embedded processes being restarted (the sandbox provider, say) are named too.
    const embedded = deps.embedded?.() ?? {};
    const restarting = Object.entries(embedded)
      .filter(([, s]) => s !== 'ok')
      .map(([name]) => `${name}: restarting`);
    const failing = [...checks.filter((c): c is string => c !== null), ...restarting];
    if (failing.length) {
      throw new ServiceUnavailableError(`Not ready: ${failing.join('; ')}`, {
        mongodb: checks[0] === null ? 'ok' : 'unavailable',
        temporal: checks[1] === null ? 'ok' : 'unavailable',
        ...(Object.keys(embedded).length ? { embedded } : {}),
      });
    }
    ctx.body = {
      status: 'ok',
      checks: { mongodb: 'ok', temporal: 'ok' },
      ...(Object.keys(embedded).length ? { embedded } : {}),
      decisions_execution: deps.decisions.mode,
    };
  });

  return router;
}
