// The signal a handler passes to work done for a request: it fires when the client goes away before
// its answer is written, or when the request's time is up.
import type Koa from 'koa';

export function requestSignal(
  ctx: Koa.ParameterizedContext,
  timeoutMs: number | null,
): { signal: AbortSignal; timedOut: () => boolean; done: () => void } {
  // One controller and at most one timer per request: AbortSignal.timeout/any cost more on this hot path.
  const controller = new AbortController();
  let timedOut = false;
  const timer =
    timeoutMs === null
      ? null
      : setTimeout(() => {
          timedOut = true;
          controller.abort();
        }, timeoutMs);
  ctx.res.once('close', () => {
    if (!ctx.res.writableFinished) controller.abort();
  });
  return { signal: controller.signal, timedOut: () => timedOut, done: () => timer && clearTimeout(timer) };
}

/** The client went away before its answer was written (nginx's 499 "client closed request"). */
export function clientClosed(ctx: Koa.Context | Koa.ParameterizedContext): boolean {
  return !ctx.res.writableFinished && (ctx.res.destroyed || ctx.req.socket?.destroyed === true);
}
