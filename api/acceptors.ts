// Extra listening descriptors of the API server's socket, listened on while the process is busy, so
// that it then accepts up to that many new connections per event-loop turn (nginx's `multi_accept`,
// in spirit).
//
// Why: since libuv 1.45 (Node 20 has 1.46) a listening descriptor accepts one connection per loop
// turn. Under load a turn takes 20-80 ms (it runs every request whose bytes arrived meanwhile), so
// a burst of 200 new connections waited up to 1.3 s for its last accept (docs/performance.md). Each
// descriptor is watched on its own, so N descriptors of one socket accept up to N per turn.
//
// Only while busy: every descriptor is woken by each new connection, so at rest they would cost
// ~3 µs each per connection arriving alone; and with several API processes on one socket, an idle
// process with many descriptors took a whole small burst, leaving the others without connections.
// At rest a process accepts on its one descriptor, as Node does, and the processes share bursts.
//
// Node cannot dup(2) a descriptor, but a handle sent over an IPC channel arrives as a new one: a
// short-lived helper process receives the socket's handle and sends it back N - 1 times. The helper
// never listens on it (a raw handle, not a server), so it cannot take a connection. Closing a
// descriptor is the only way to stop watching it, so the spares are fetched again once the process
// is at rest (one helper per busy spell, at most one per IDLE_MS).
import { spawn } from 'node:child_process';
import type http from 'node:http';
import net from 'node:net';
import { performance } from 'node:perf_hooks';
import type { Logger } from '../infrastructure/log';

/** How long the helper may take before the server goes on without the copies. */
const HELPER_TIMEOUT_MS = 10_000;
/**
 * The loop counts as busy above this share of time running, over at least BUSY_WINDOW_MS (a burst
 * reaching several idle processes is shared one connection per turn each for that long); a window
 * longer than STALE_MS (a connection after a quiet spell) says nothing about the present.
 */
const BUSY_UTILIZATION = 0.5;
const BUSY_WINDOW_MS = 50;
const STALE_MS = 1_000;
/**
 * Extra descriptors are closed after a spell this long below AT_REST_UTILIZATION. Long: fetching
 * spares again forks the helper, which holds this process's loop ~10 ms at a few hundred MB.
 */
const IDLE_MS = 60_000;
const AT_REST_UTILIZATION = 0.2;

/** The helper: sends each handle it receives back `n` times, then leaves once they are taken. */
const ECHO = `process.on('message', (m, handle) => {
  for (let i = 0; i < m.n; i++) process.send('handle', handle);
  process.send('done', () => process.disconnect());
});`;

/** A descriptor of the socket as received over IPC: a raw handle, listened on or closed. */
type RawHandle = object & { close(): void };

export interface AcceptorsOptions {
  /** Descriptors to accept on while busy, the server's own included (HTTP_ACCEPTORS). */
  count: number;
  logger: Logger;
  /** Runs the helper: Node itself. */
  execPath?: string;
  /** How long at rest before the extra descriptors are closed (tests shrink it). */
  idleMs?: number;
}

/** The extra descriptors of one server's socket. */
export class Acceptors {
  private spares: RawHandle[] = [];
  private readonly listening: net.Server[] = [];
  private fetching: Promise<void> | null = null;
  private closed = false;
  private mark = performance.eventLoopUtilization();
  private restMark = this.mark;
  private readonly restTimer: NodeJS.Timeout;

  private constructor(
    private readonly server: http.Server,
    private readonly opts: AcceptorsOptions,
  ) {
    server.on('connection', this.onConnection);
    const idleMs = opts.idleMs ?? IDLE_MS;
    this.restTimer = setInterval(() => this.checkRest(), idleMs).unref();
  }

  /**
   * Fetches `count - 1` spare descriptors of `server`'s socket. Never fails: without the helper,
   * the server keeps its one descriptor (logged).
   */
  static async start(server: http.Server, opts: AcceptorsOptions): Promise<Acceptors> {
    const acceptors = new Acceptors(server, opts);
    await acceptors.fetchSpares();
    // Start-up's own work is not load: judged from here, a fresh process's first burst is shared.
    acceptors.mark = acceptors.restMark = performance.eventLoopUtilization();
    return acceptors;
  }

  /** Extra descriptors being listened on now (0 at rest). */
  get active(): number {
    return this.listening.length;
  }

  /** Spare descriptors held for the next busy spell. */
  get spare(): number {
    return this.spares.length;
  }

  /** Listens on every spare descriptor, so up to `count` connections are accepted per loop turn. */
  widen(): void {
    for (const handle of this.spares.splice(0)) {
      const a = net.createServer(socketOptions(this.server));
      a.on('connection', (socket) => this.server.emit('connection', socket));
      // accept(2) failing (EMFILE) is the server's condition, not a reason to stop the process.
      a.on('error', (err) => this.opts.logger.warn({ err: err.message }, 'an acceptor failed to accept a connection'));
      a.listen(handle);
      this.listening.push(a);
    }
  }

  /** Back to the one descriptor: closes the extra ones and fetches new spares. */
  narrow(): void {
    for (const a of this.listening.splice(0)) a.close();
    void this.fetchSpares();
  }

  /**
   * Stops accepting on every extra descriptor; resolves once the connections each accepted are
   * closed (each counts its own; the server holds them all for closeIdleConnections and
   * closeAllConnections).
   */
  async close(): Promise<void> {
    this.closed = true;
    clearInterval(this.restTimer);
    this.server.off('connection', this.onConnection);
    await this.fetching;
    for (const handle of this.spares.splice(0)) handle.close();
    await Promise.all(this.listening.splice(0).map((a) => new Promise<void>((resolve) => a.close(() => resolve()))));
  }

  /** On each new connection: a loop busy of late widens (judged at most once per BUSY_WINDOW_MS). */
  private readonly onConnection = (): void => {
    if (this.listening.length || !this.spares.length) return;
    const now = performance.eventLoopUtilization();
    const since = performance.eventLoopUtilization(now, this.mark);
    const elapsed = since.idle + since.active;
    if (elapsed < BUSY_WINDOW_MS) return;
    this.mark = now;
    if (elapsed <= STALE_MS && since.utilization > BUSY_UTILIZATION) this.widen();
  };

  private checkRest(): void {
    const now = performance.eventLoopUtilization();
    const since = performance.eventLoopUtilization(now, this.restMark);
    this.restMark = now;
    if (this.listening.length && since.utilization < AT_REST_UTILIZATION) this.narrow();
  }

  private fetchSpares(): Promise<void> {
    const handle = (this.server as unknown as { _handle?: unknown })._handle;
    const wanted = this.opts.count - 1 - this.spares.length;
    if (this.closed || this.fetching || wanted <= 0 || !handle || process.platform === 'win32') return this.fetching ?? Promise.resolve();
    this.fetching = copiesOf(handle, wanted, this.opts.execPath ?? process.execPath)
      .then((copies) => {
        if (this.closed) for (const c of copies) c.close();
        else this.spares.push(...copies);
      })
      .catch((err: Error) =>
        this.opts.logger.warn({ err: err.message }, 'could not add acceptors to the listening socket; accepting with one'),
      )
      .finally(() => (this.fetching = null));
    return this.fetching;
  }
}

/** `n` new descriptors of `handle`'s socket, from a helper process. */
function copiesOf(handle: unknown, n: number, execPath: string): Promise<RawHandle[]> {
  const copies: RawHandle[] = [];
  return new Promise<RawHandle[]>((resolve, reject) => {
    // Not fork(): the gateway's own flags (a --cpu-prof, say) are not the helper's. Its stderr is
    // not inherited: libuv makes a child's inherited standard descriptors blocking, for every
    // process sharing them, and under `2>&1` stdout is that same pipe: a log reader that stopped
    // would then freeze this process's writes to it (infrastructure/log/stdout.ts).
    const helper = spawn(execPath, ['-e', ECHO], {
      stdio: ['ignore', 'ignore', 'pipe', 'ipc'],
      env: { ...process.env, NODE_OPTIONS: '' },
    });
    let said = '';
    helper.stderr!.setEncoding('utf8').on('data', (text: string) => (said = (said + text).slice(-1_000)));
    let settled = false;
    const fail = (err: Error) => {
      if (settled) return; // the helper leaving after 'done'
      settled = true;
      clearTimeout(timer);
      for (const c of copies.splice(0)) c.close();
      reject(err);
    };
    const timer = setTimeout(() => {
      helper.kill();
      fail(new Error(`no answer within ${HELPER_TIMEOUT_MS} ms`));
    }, HELPER_TIMEOUT_MS);
    helper.once('error', fail);
    helper.once('close', (code) => fail(new Error(`helper exited (code ${code}) before sending the handles${said && `: ${said.trim()}`}`)));
    helper.on('message', (message, copy) => {
      if (message !== 'done') {
        copies.push(copy as unknown as RawHandle);
        return;
      }
      settled = true;
      clearTimeout(timer);
      resolve(copies);
    });
    helper.send({ n }, handle as net.Server);
  });
}

/**
 * The options `server` gives the sockets it accepts (http.Server sets allowHalfOpen and noDelay),
 * as net.Server keeps them on itself: Node's types do not declare these fields.
 */
export function socketOptions(server: net.Server): net.ServerOpts {
  const { allowHalfOpen, noDelay, keepAlive, keepAliveInitialDelay, highWaterMark } = server as unknown as Required<net.ServerOpts>;
  return { allowHalfOpen, noDelay, keepAlive, keepAliveInitialDelay, highWaterMark };
}
