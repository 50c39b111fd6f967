// The signal a handler passes to work done for a request: it fires when the client goes away before
// its answer is written, or when the request's time is up.
import { setMaxListeners } from 'node:events';
import type { Socket } from 'node:net';
import type Koa from 'koa';

const CONNECTION_SIGNAL = Symbol('gateway.connectionSignal');
type WithSignal = Socket & { [CONNECTION_SIGNAL]?: AbortController };

/**
 * Fires when the client's connection closes. One per connection, not per request: making an
 * AbortSignal costs ~2.5 µs of CPU, and a keep-alive client sends thousands of requests on one
 * connection. A client that goes away closes its connection; a request whose answer was written
 * has no listener left on it by then (every wait removes its own), so a later close touches nothing.
 */
function connectionSignal(socket: WithSignal): AbortSignal {
  let controller = socket[CONNECTION_SIGNAL];
  if (!controller) {
    const c = (controller = socket[CONNECTION_SIGNAL] = new AbortController());
    // Pipelined requests on one connection each listen while they wait: no fixed bound applies.
    setMaxListeners(0, c.signal);
    if (socket.destroyed) c.abort();
    else socket.once('close', () => c.abort());
  }
  return controller.signal;
}

export function requestSignal(
  ctx: Koa.ParameterizedContext,
  timeoutMs: number | null,
): { signal: AbortSignal; timedOut: () => boolean; done: () => void } {
  const connection = connectionSignal(ctx.req.socket);
  if (timeoutMs === null) return { signal: connection, timedOut: () => false, done: () => undefined };
  // One controller and one timer: AbortSignal.timeout/any cost more on this path.
  const controller = new AbortController();
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    controller.abort();
  }, timeoutMs);
  const onClose = () => controller.abort();
  if (connection.aborted) controller.abort();
  else connection.addEventListener('abort', onClose, { once: true });
  return {
    signal: controller.signal,
    timedOut: () => timedOut,
    done: () => {
      clearTimeout(timer);
      connection.removeEventListener('abort', onClose);
    },
  };
}

/** The client went away before its answer was written (nginx's 499 "client closed request"). */
export function clientClosed(ctx: Koa.Context | Koa.ParameterizedContext): boolean {
  return !ctx.res.writableFinished && (ctx.res.destroyed || ctx.req.socket?.destroyed === true);
}
