// A route's JSON answer, written the moment its handler returns. Koa writes `ctx.body` only once
// every middleware has returned (the route's chain, the routers, the error and request-context
// layers, the metrics): at c=1 that unwinding put ~20 µs between a call's durable usage record and
// its answer. The layers on the way out still read `ctx.status`, which stays as the handler set it.
import type Koa from 'koa';
import { nextTurn, TURN_SPLIT_BYTES } from '../infrastructure/concurrency/next-turn';
import { hasLongArray, stringifyInTurns } from '../infrastructure/concurrency/json-in-turns';

/** A body Koa would serialise as JSON: a plain object or an array (not a stream, buffer or text). */
function isJsonBody(body: unknown): body is object {
  if (body === null || typeof body !== 'object') return false;
  const proto = Object.getPrototypeOf(body);
  return Array.isArray(body) || proto === Object.prototype || proto === null;
}

/**
 * Writes `ctx.body` now when it is JSON; anything else (HEAD, streams, no body) is left to Koa. A
 * body with a long array is serialised in turns: then it returns a promise, settled once the body
 * is serialised (a failure to serialise is the handler's error, as a whole one's is), and the
 * writing goes on after it.
 */
export function sendJson(ctx: Koa.Context | Koa.ParameterizedContext): void | Promise<void> {
  if (ctx.respond === false || ctx.method === 'HEAD' || !isJsonBody(ctx.body)) return;
  if (hasLongArray(ctx.body)) return stringifyInTurns(ctx.body).then((pieces) => send(ctx, pieces));
  send(ctx, [JSON.stringify(ctx.body)]);
}

/** Writes a body's text, in pieces: a large one encoded and written in turns. */
function send(ctx: Koa.Context | Koa.ParameterizedContext, pieces: string[]): void {
  ctx.respond = false; // Koa's respond() would write the body a second time
  // A client that went away gets nothing; the metrics count it as closed (request-signal).
  if (!ctx.writable) return;
  // Setting an object body set its type already (Koa: `application/json; charset=utf-8`, unless the handler chose one).
  const res = ctx.res;
  if (pieces.length === 1 && pieces[0].length < TURN_SPLIT_BYTES) {
    res.setHeader('content-length', Buffer.byteLength(pieces[0]));
    res.end(pieces[0]);
    return;
  }
  // A large answer is counted and each of its pieces encoded and written in a turn of its own (33 MB
  // of embeddings held the event loop ~0.9 s from the provider's last byte to the client's).
  // Nothing else answers meanwhile (Koa's own writing is off), but a client may leave.
  void (async () => {
    await nextTurn();
    if (res.destroyed || res.headersSent) return;
    let length = 0;
    for (const piece of pieces) length += Buffer.byteLength(piece);
    res.setHeader('content-length', length);
    for (const piece of pieces) {
      await nextTurn();
      if (res.destroyed || res.writableEnded) return;
      // Once the socket has its fill, the next piece waits: pieces queued unwritten are encoded
      // together when it drains, in one turn (97 ms for 30 MB).
      if (!res.write(piece)) await drainedOrClosed(res);
    }
    if (!res.destroyed) res.end();
  })();
}

function drainedOrClosed(res: NodeJS.WritableStream): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      res.off('drain', done);
      res.off('close', done);
      resolve();
    };
    res.on('drain', done);
    res.on('close', done);
  });
}
