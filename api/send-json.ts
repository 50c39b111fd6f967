// A hot route's 200 answer, written the moment it is ready. Koa writes `ctx.body` only once every
// middleware has returned (the route's chain, the routers, the error and request-context layers,
// the metrics): at c=1 that unwinding put ~20 µs between the durable usage record and the answer.
// What the layers do on the way out (metrics, the request log) reads `ctx.status`, set here.
import type Koa from 'koa';

export function sendJson(ctx: Koa.Context | Koa.ParameterizedContext, body: unknown): void {
  const json = JSON.stringify(body);
  ctx.status = 200;
  ctx.respond = false; // Koa's respond() would write the body a second time
  // A client that went away gets nothing; the metrics count it as closed (request-signal).
  if (!ctx.writable) return;
  ctx.res.setHeader('content-type', 'application/json; charset=utf-8');
  ctx.res.setHeader('content-length', Buffer.byteLength(json));
  ctx.res.end(json);
}
