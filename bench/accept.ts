// Why a busy Node server's p99 at c=200 is seconds, and what several processes change: a plain
// node:http server (0.5 ms of CPU per request, a 1 ms wait) under 200 closed-loop clients, each
// opening its connection at the start, as the proxy bench's load generator does. Since libuv 1.45
// a process accepts one connection per event-loop turn, so under load a burst of new connections
// waits in the kernel's accept queue, one turn each. Compared: one process; two cluster processes
// with the primary's round robin (it hands over one connection per acknowledgement); two that
// accept from the shared socket themselves (SCHED_NONE, what API_PROCESSES runs).
import cluster from 'node:cluster';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { freePort, startProcess } from '../devstack/processes';
import { loadSamples, mergeSamples, summarize, writeResult, type LoadSamples } from './harness';

const CLIENTS = 200;
const REQUESTS = 10_000;
const ROUNDS = 3;

/** The server side, when this file runs as `node accept.js serve` (forked for each layout). */
function serve(): void {
  const workers = Number(process.env.ACCEPT_WORKERS);
  if (workers > 0 && cluster.isPrimary) {
    cluster.schedulingPolicy = process.env.ACCEPT_POLICY === 'none' ? cluster.SCHED_NONE : cluster.SCHED_RR;
    for (let i = 0; i < workers; i++) cluster.fork();
    return;
  }
  http
    .createServer((req, res) => {
      req.resume();
      req.on('end', () =>
        setImmediate(() => {
          const until = performance.now() + 0.5;
          while (performance.now() < until);
          setTimeout(() => res.end('{"ok":true}'), 1);
        }),
      );
    })
    .listen(Number(process.env.ACCEPT_PORT), '127.0.0.1');
}

/** ROUNDS rounds, each on CLIENTS new connections (the load generator opens one per worker). */
async function load(url: string) {
  let merged: LoadSamples | undefined;
  for (let round = 0; round < ROUNDS; round++) merged = mergeSamples(merged, await loadSamples(url, {}, {}, CLIENTS, REQUESTS));
  const { rps, p50_ms, p99_ms, errors } = summarize(merged!);
  return {
    rps,
    p50_ms,
    p99_ms,
    max_ms: Math.round(Math.max(...merged!.latencies)),
    // Requests that waited for their connection to be accepted: the other latencies stay under it.
    over_300_ms: merged!.latencies.filter((ms) => ms > 300).length,
    errors,
  };
}

export async function benchAccept() {
  const layouts = {
    one_process: { ACCEPT_WORKERS: '0' },
    two_processes_round_robin: { ACCEPT_WORKERS: '2', ACCEPT_POLICY: 'rr' },
    two_processes_own_accept: { ACCEPT_WORKERS: '2', ACCEPT_POLICY: 'none' },
  };
  const rows: Record<string, unknown>[] = [];
  for (const [layout, env] of Object.entries(layouts)) {
    const port = await freePort();
    const server = startProcess(`accept-${layout}`, process.execPath, [path.join(__dirname, 'accept.js'), 'serve'], {
      ...process.env,
      ...env,
      ACCEPT_PORT: String(port),
    });
    const url = `http://127.0.0.1:${port}`;
    await server.waitUntil(
      async () => {
        await fetch(url, { method: 'POST', body: '{}' });
      },
      10_000,
      'listening',
    );
    try {
      rows.push({ layout, clients: CLIENTS, ...(await load(url)) });
      console.log(JSON.stringify(rows[rows.length - 1]));
    } finally {
      await server.stop();
    }
  }
  const result = {
    benchmark: 'accept',
    at: new Date().toISOString(),
    machine: { cpus: os.cpus().length, node: process.version, uv: process.versions.uv },
    rows,
  };
  console.log(`results: ${writeResult('accept', result)}`);
  return result;
}

if (require.main === module && process.argv[2] === 'serve') serve();
