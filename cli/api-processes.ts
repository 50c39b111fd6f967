// API_PROCESSES > 1: several API processes share one port (node:cluster), with, under `gateway
// start`, a Temporal worker in a process of its own beside them. Each accepts connections
// from the shared socket itself (SCHED_NONE): the primary's round robin handed them over one at a
// time, each after the receiving process's acknowledgement, and since libuv 1.45 a busy process
// accepts one connection per event-loop turn, so a burst of new connections under load waited
// seconds (see docs/performance.md). The primary serves no request itself: it starts the
// processes, restarts one that dies, gathers their metrics and stops them on a signal. Each API
// process has its own usage journal (one instance per process in the journal directory), key and
// rate-limit caches; what they must agree on (balances, rate-limit tickets, sessions' endpoints,
// batches) is in the database or derived the same way everywhere.
import cluster, { type Worker } from 'node:cluster';
import path from 'node:path';
import type { Logger } from '../infrastructure/log';
import { serveClusterMetrics } from '../infrastructure/metrics/cluster';
import type { Stop } from './signals';

type EmbeddedStatus = Record<string, 'ok' | 'restarting'>;

const READY = 'gateway:ready';
const EMBEDDED = 'gateway:embedded';
/** Which process this is (API processes 0 to API_PROCESSES − 1, then the worker): its metrics label and Temporal metrics port offset. */
const INDEX_ENV = 'GATEWAY_API_PROCESS';
/**
 * The embedded services' state when the process was started: what its /readyz says from its first
 * request (it starts listening before the primary's first message can reach it, and a client told
 * "ready" may ask at once). Changes since are sent as messages (EMBEDDED).
 */
const EMBEDDED_ENV = 'GATEWAY_EMBEDDED';
/** A process dying this often within RESTART_WINDOW_MS is not restarted again: the gateway stops. */
const MAX_RESTARTS = 5;
const RESTART_WINDOW_MS = 60_000;

export interface ApiProcessesOptions {
  count: number;
  /** The `gateway` command each process runs (`api`, with `--with-worker` or not). */
  args: string[];
  /**
   * A Temporal worker in a process of its own beside them (`gateway worker`), restarted like them
   * and counted in their metrics: batch lines then take no turns of the API processes' event loops
   * from the synchronous calls.
   */
  worker?: boolean;
  env: NodeJS.ProcessEnv;
  logger: Logger;
  /** Temporal's own metrics: process i serves them on this port + i (each process is its own Temporal client). */
  temporalMetricsPort: number | null;
  /** Under `gateway start`: the embedded services' state, passed on to each process's /readyz. */
  embedded?: () => EmbeddedStatus;
  /** Called once the processes are stopped because one kept dying; the caller stops the rest. */
  giveUp: (message: string) => void;
  readyTimeoutMs?: number;
  shutdownGraceMs: number;
}

export async function startApiProcesses(opts: ApiProcessesOptions): Promise<{ url: string; stop: Stop }> {
  const { count, logger } = opts;
  cluster.schedulingPolicy = cluster.SCHED_NONE;
  serveClusterMetrics();
  /** The worker process's number: after the API processes'. */
  const workerIndex = count;
  let stopping = false;
  const exits: number[] = [];
  const live = new Map<number, Worker>();

  const fork = (index: number): Worker => {
    // Settings apply to the forks after them: each fork says which command it runs.
    cluster.setupPrimary({ exec: path.join(__dirname, 'index.js'), args: index === workerIndex ? ['worker'] : opts.args });
    const env: NodeJS.ProcessEnv = { ...opts.env, [INDEX_ENV]: String(index) };
    if (opts.temporalMetricsPort !== null) env.TEMPORAL_METRICS_PORT = String(opts.temporalMetricsPort + index);
    if (opts.embedded) env[EMBEDDED_ENV] = JSON.stringify(opts.embedded());
    const worker = cluster.fork(env);
    live.set(index, worker);
    // Once it listens for messages: a change during its start-up may have been sent before that.
    worker.on('message', (m: { type?: string }) => {
      if (m?.type === READY && opts.embedded) worker.send({ type: EMBEDDED, status: opts.embedded() });
    });
    worker.on('exit', (code, signal) => {
      if (live.get(index) === worker) live.delete(index);
      if (stopping) return;
      const now = Date.now();
      exits.push(now);
      while (exits.length && exits[0] < now - RESTART_WINDOW_MS) exits.shift();
      if (exits.length >= MAX_RESTARTS) {
        const message = `API processes exited ${exits.length} times within a minute (last: process ${index}, ${signal ?? `code ${code}`}); stopping`;
        void stop().then(() => opts.giveUp(message));
        return;
      }
      logger.error(
        { process: index, code, signal },
        index === workerIndex ? 'worker process exited; starting another' : 'API process exited; starting another',
      );
      setTimeout(() => !stopping && fork(index), 500).unref();
    });
    return worker;
  };

  const timeoutMs = opts.readyTimeoutMs ?? 120_000;
  const ready = (worker: Worker, index: number) =>
    new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`API process ${index} not ready after ${timeoutMs} ms`)), timeoutMs);
      const onExit = (code: number | null, signal: string | null) => {
        clearTimeout(timer);
        reject(new Error(`API process ${index} exited before it was ready (${signal ?? `code ${code}`}); its log says why`));
      };
      worker.once('exit', onExit);
      worker.on('message', (m: { type?: string; url?: string }) => {
        if (m?.type !== READY) return;
        clearTimeout(timer);
        worker.off('exit', onExit);
        resolve(m.url!);
      });
    });

  const stop: Stop = async () => {
    stopping = true;
    clearInterval(relay);
    const workers = [...live.values()];
    await Promise.all(
      workers.map(
        (w) =>
          new Promise<void>((resolve) => {
            if (w.isDead()) return resolve();
            const kill = setTimeout(() => w.process.kill('SIGKILL'), opts.shutdownGraceMs + 10_000);
            w.once('exit', () => {
              clearTimeout(kill);
              resolve();
            });
            w.process.kill('SIGTERM');
          }),
      ),
    );
  };
  // Each process learns of a change in the embedded services within 100 ms (/readyz reports it).
  const { embedded } = opts;
  let said = '';
  const relay = embedded
    ? setInterval(() => {
        const status = embedded();
        const text = JSON.stringify(status);
        if (text === said) return;
        said = text;
        for (const w of live.values()) if (w.isConnected()) w.send({ type: EMBEDDED, status });
      }, 100).unref()
    : undefined;

  try {
    const started = Array.from({ length: count + (opts.worker ? 1 : 0) }, (_, i) => ready(fork(i), i));
    const urls = await Promise.all(started);
    logger.info({ url: urls[0], processes: count, worker_process: opts.worker === true }, 'API processes listening');
    return { url: urls[0], stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

/**
 * In a process the primary started: which one it is, the embedded services' state it relays, and
 * how to say it is ready (an API process: listening, with its URL). Null in a process of its own.
 */
export function apiProcessMember(): { index: number; embedded: () => EmbeddedStatus; ready(url: string): void } | null {
  if (!cluster.isWorker) return null;
  let status = JSON.parse(process.env[EMBEDDED_ENV] ?? '{}') as EmbeddedStatus;
  process.on('message', (m: { type?: string; status?: EmbeddedStatus }) => {
    if (m?.type === EMBEDDED && m.status) status = m.status;
  });
  return {
    index: Number(process.env[INDEX_ENV] ?? 0),
    embedded: () => status,
    ready: (url) => process.send!({ type: READY, url }),
  };
}
