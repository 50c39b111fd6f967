// The Koa application: request context ▶ error envelope ▶ routes. Anything unmatched is a 404 or
// 405 in the same envelope.
import Koa from 'koa';
import { MethodNotAllowedError, NotFoundError } from '../errors';
import { errorMiddleware } from './errors';
import { requestContext } from './request-context';
import { healthRoutes } from './routes/health';
import type { AppDeps } from './deps';

export function createApp(deps: AppDeps): Koa {
  const app = new Koa();
  app.proxy = false;
  app.silent = true; // errorMiddleware logs; Koa's default stderr printing would duplicate it
  app.use(requestContext(deps.logger));
  app.use(errorMiddleware());
  app.use(async (ctx, next) => {
    await next();
    // Nothing answered (and allowedMethods saw no other method for this path).
    if (ctx.status === 404 && ctx.body == null) throw new NotFoundError(`No route for ${ctx.method} ${ctx.path}`);
  });

  for (const router of [healthRoutes(deps)]) {
    app.use(router.routes());
    app.use(router.allowedMethods({
      throw: true,
      methodNotAllowed: () => new MethodNotAllowedError('Method not allowed on this route'),
      notImplemented: () => new MethodNotAllowedError('Method not implemented'),
    }));
  }
  return app;
}
