// A server-sent-events answer written straight to the socket: headers are sent when the first
// event is (or when a keep-alive comment has to be), each write waits while the client's buffer
// is full (so a slow reader slows the provider, not the gateway's memory), and a provider that is
// silent for a while gets `: keep-alive` comments sent in its place. A client that reads nothing for
// `stallMs` is cut off, as nginx's send_timeout does: else a stream it stopped reading would hold its
// provider slot and both sockets for as long as it kept the connection open.
import type Koa from 'koa';

export class EventStream {
  private committed = false;
  private wroteSinceTick = false;
  private readonly timer: NodeJS.Timeout;

  constructor(
    private readonly ctx: Koa.ParameterizedContext,
    private readonly headers: Record<string, string>,
    keepAliveMs: number,
    private readonly stallMs: number,
  ) {
    // Ticks at half the interval, so a silence never runs much past `keepAliveMs`.
    this.timer = setInterval(() => {
      if (!this.wroteSinceTick) this.send(': keep-alive\n\n');
      this.wroteSinceTick = false;
    }, keepAliveMs / 2);
    this.timer.unref();
  }

  /** Whether headers went out: after that, an error can only be told as an event. */
  get started(): boolean {
    return this.committed;
  }

  get clientGone(): boolean {
    const res = this.ctx.res;
    return res.destroyed || (res.writableEnded && !res.writableFinished);
  }

  private commit(): void {
    if (this.committed) return;
    this.committed = true;
    // From here on the answer is ours to write; Koa only logs it.
    this.ctx.status = 200;
    this.ctx.respond = false;
    this.ctx.res.writeHead(200, {
      ...this.headers,
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache',
      'x-accel-buffering': 'no',
    });
  }

  /** A header for the answer; too late (ignored) once it has started. */
  setHeader(name: string, value: string): void {
    if (!this.committed) this.headers[name] = value;
  }

  private send(text: string): boolean {
    if (this.clientGone) return true;
    this.commit();
    this.wroteSinceTick = true;
    return this.ctx.res.write(text);
  }

  /** Writes `text`, resolving once the client has room for more (or has gone). */
  async write(text: string): Promise<void> {
    if (this.send(text)) return;
    const res = this.ctx.res;
    await new Promise<void>((resolve) => {
      const done = () => {
        clearTimeout(timer);
        res.off('drain', done);
        res.off('close', done);
        resolve();
      };
      // Closing the connection is what tells the provider call, through the request's signal.
      const timer = setTimeout(() => {
        this.ctx.state.log?.info({ stalled_ms: this.stallMs }, 'client read nothing of its stream for too long: connection closed');
        res.destroy();
        done();
      }, this.stallMs);
      res.on('drain', done);
      res.on('close', done);
    });
  }

  end(): void {
    clearInterval(this.timer);
    if (this.committed && !this.clientGone) this.ctx.res.end();
  }
}
