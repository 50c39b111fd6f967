// A route is declared once: method, path, auth, schemas and handler. The same declaration wires the
// Koa middleware chain (auth ▶ rate limit ▶ 402 gate ▶ body ▶ validation ▶ handler ▶ its
// JSON answer written at once, api/send-json) and the OpenAPI document.
import type Koa from 'koa';
import Router from '@koa/router';
import type { Static, TSchema } from '@sinclair/typebox';
import { compileBody, compileParams, compileQuery } from '../infrastructure/validation/index';
import { jsonBody } from './body';
import { sendJson } from './send-json';
import { authenticate, type AuthContext, type AuthLevel } from './auth';
import { admitBodyBytes, LIMIT_UNIT_BYTES, rateLimit } from './rate-limit';
import type { AppDeps } from './deps';

type Maybe<S> = S extends TSchema ? Static<S> : undefined;

export interface RouteSpec<B, Q, P> {
  method: 'get' | 'post' | 'put' | 'delete';
  /** Koa-style path under /api/v1, e.g. `/keys/:id`. */
  path: string;
  summary: string;
  tag: string;
  auth: AuthLevel;
  body?: B;
  query?: Q;
  params?: P;
  /** Billable routes are refused with 402 while the workspace balance is not positive. */
  billable?: boolean;
  /** The handler reads the body itself once its headers are checked (`body` still documents it): a batch, which may be large. */
  readsOwnBody?: boolean;
  /** `stream`: the route also answers as server-sent events (`"stream": true`), described so. */
  responses: Record<number, { description: string; schema?: TSchema; contentType?: string; stream?: string }>;
  handler: (ctx: Koa.ParameterizedContext, input: { body: Maybe<B>; query: Maybe<Q>; params: Maybe<P> }) => unknown;
}

export type AnyRoute = RouteSpec<TSchema | undefined, TSchema | undefined, TSchema | undefined>;

export function defineRoute<
  B extends TSchema | undefined = undefined,
  Q extends TSchema | undefined = undefined,
  P extends TSchema | undefined = undefined,
>(spec: RouteSpec<B, Q, P>): AnyRoute {
  return spec as unknown as AnyRoute;
}

/** Registers routes on a router; validators are compiled here, once, at start-up. */
export function mountRoutes(router: Router, routes: AnyRoute[], deps: AppDeps): void {
  for (const spec of routes) {
    const body = spec.body && !spec.readsOwnBody ? compileBody(spec.body) : null;
    const query = spec.query ? compileQuery(spec.query) : null;
    const params = spec.params ? compileParams(spec.params) : null;
    const chain: Koa.Middleware[] = [];
    if (spec.auth !== 'none') chain.push(authenticate(deps, spec.auth), rateLimit(deps));
    if (spec.billable) {
      chain.push(async (ctx, next) => {
        await deps.workspaces.assertCanSpend((ctx.state.auth as AuthContext).workspaceId);
        await next();
      });
    }
    if (spec.body) {
      const { bodyLimitBytes, bodyMaxDepth, bodyIdleMs } = deps.config.http;
      chain.push(
        jsonBody(
          { limitBytes: bodyLimitBytes, maxDepth: bodyMaxDepth, idleMs: bodyIdleMs },
          {
            read: !spec.readsOwnBody,
            memory: deps.bodyMemory,
            bodyBytes: { minBytes: LIMIT_UNIT_BYTES, admit: (workspaceId, bytes) => admitBodyBytes(deps.bodyBytes, workspaceId, bytes) },
          },
        ),
      );
    }
    chain.push(async (ctx) => {
      const input = {
        body: body ? body(ctx.request.body) : undefined,
        query: query ? query({ ...ctx.query }) : undefined,
        params: params ? params({ ...ctx.params }) : undefined,
      };
      await spec.handler(ctx, input as never);
      const sent = sendJson(ctx);
      if (sent) await sent;
    });
    router[spec.method](spec.path, ...(chain as Parameters<Router['get']>[1][]));
  }
}
