// A route's JSON answer, written the moment its handler returns. Koa writes `ctx.body` only once
// every middleware has returned (the route's chain, the routers, the error and request-context
// layers, the metrics): at c=1 that unwinding put ~20 µs between a call's durable usage record and
// its answer. The layers on the way out still read `ctx.status`, which stays as the handler set it.
import type Koa from 'koa';
import { TURN_SPLIT_BYTES } from '../infrastructure/concurrency/next-turn';

/** A body Koa would serialise as JSON: a plain object or an array (not a stream, buffer or text). */
function isJsonBody(body: unknown): body is object {
  if (body === null || typeof body !== 'object') return false;
  const proto = Object.getPrototypeOf(body);
  return Array.isArray(body) || proto === Object.prototype || proto === null;
}

/** Writes `ctx.body` now when it is JSON; anything else (HEAD, streams, no body) is left to Koa. */
export function sendJson(ctx: Koa.Context | Koa.ParameterizedContext): void {
  if (ctx.respond === false || ctx.method === 'HEAD' || !isJsonBody(ctx.body)) return;
  const json = JSON.stringify(ctx.body);
  ctx.respond = false; // Koa's respond() would write the body a second time
  // A client that went away gets nothing; the metrics count it as closed (request-signal).
  if (!ctx.writable) return;
  // Setting an object body set its type already (Koa: `application/json; charset=utf-8`, unless the handler chose one).
  if (json.length < TURN_SPLIT_BYTES) {
    ctx.res.setHeader('content-length', Buffer.byteLength(json));
    ctx.res.end(json);
    return;
  }
  // A large answer is serialised, encoded and written each in a turn of its own (33 MB of
  // embeddings held the event loop ~0.9 s from the provider's last byte to the client's).
  // Nothing else answers meanwhile (Koa's own writing is off), but a client may leave.
  const res = ctx.res;
  setImmediate(() => {
    if (res.destroyed || res.headersSent) return;
    const bytes = Buffer.from(json);
    res.setHeader('content-length', bytes.length);
    setImmediate(() => {
      if (!res.destroyed && !res.writableEnded) res.end(bytes);
    });
  });
}
