// Shared benchmark plumbing: a stack of real processes on free ports, a closed-loop load
// generator over keep-alive HTTP, and per-process CPU time from /proc.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Client } from 'undici';
import { parse } from 'yaml';
import { defaultToolsDir } from '../infrastructure/config';
import { ensureTools } from '../devstack/binaries';
import { freePort, startProcess, type ManagedProcess } from '../devstack/processes';
import { startFerretDB, startTemporalServer } from '../devstack/services';
import { Store } from '../infrastructure/store';
import { createWorkspace } from '../domain/accounts/workspaces';
import { createKey } from '../domain/accounts/keys';
import { grantCredits } from '../domain/accounts/credits';

export interface Stack {
  dataDir: string;
  mongoUri: string;
  temporalAddress: string;
  sandboxUrl: string;
  /** The first gateway's URL; `gatewayUrls` has each by name. */
  gatewayUrl: string;
  gatewayUrls: Record<string, string>;
  processes: Record<string, ManagedProcess>;
  stop(): Promise<void>;
}

const cli = path.join(__dirname, '..', 'cli', 'index.js');

/**
 * Temporal (file-backed, as `npm start` runs it), FerretDB, the sandbox and gateway processes (one
 * per entry of `gateways`, each with its own extra environment) on the same services.
 * BENCH_CPU_PROF=<dir> runs the gateways under `node --cpu-prof`, writing profiles there on stop.
 */
export async function startStack(
  env: Record<string, string> = {},
  opts: {
    temporalInMemory?: boolean;
    gateways?: Record<string, Record<string, string>>;
    /** The first gateway serves the API only, and a `worker` process of its own runs its batches. */
    separateWorker?: boolean;
    /** The Temporal server's dynamic config, when not the gateway's own (TEMPORAL_DYNAMIC_CONFIG). */
    temporalDynamicConfig?: Record<string, string | number | boolean>;
  } = {},
): Promise<Stack> {
  const tools = await ensureTools(process.env.TOOLS_DIR ?? defaultToolsDir(), { temporal: true, ferretdb: true });
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'gateway-bench-'));
  const [ferret, temporal] = await Promise.all([
    startFerretDB({ binary: tools.ferretdb, port: await freePort(), dataDir: path.join(dataDir, 'ferretdb') }),
    startTemporalServer({
      binary: tools.temporal,
      port: await freePort(),
      uiPort: null,
      dbFile: opts.temporalInMemory ? null : path.join(dataDir, 'temporal.db'),
      namespace: 'default',
      dynamicConfig: opts.temporalDynamicConfig,
    }),
  ]);
  const sandboxPort = await freePort();
  const sandbox = startProcess('sandbox', process.execPath, [cli, 'sandbox'], {
    ...process.env,
    SANDBOX_PORT: String(sandboxPort),
    LOG_LEVEL: 'warn',
  });
  const sandboxUrl = `http://127.0.0.1:${sandboxPort}`;
  await sandbox.waitUntil(
    async () => {
      if (!(await fetch(`${sandboxUrl}/healthz`)).ok) throw new Error('not yet');
    },
    15_000,
    'answering',
  );
  const profileDir = process.env.BENCH_CPU_PROF;
  const gateways: Record<string, ManagedProcess> = {};
  const gatewayUrls: Record<string, string> = {};
  const entries = Object.entries(opts.gateways ?? { gateway: {} });
  for (const [i, [name, extra]] of entries.entries()) {
    const port = await freePort();
    // One folder per gateway: the main thread's profile is the largest file in it (workflow threads write their own).
    const nodeArgs = profileDir ? ['--cpu-prof', `--cpu-prof-dir=${path.resolve(profileDir, name)}`] : [];
    const gatewayEnv = {
      ...process.env,
      PORT: String(port),
      MONGODB_URI: ferret.address,
      TEMPORAL_ADDRESS: temporal.address,
      SANDBOX_URL: sandboxUrl,
      // Each gateway its own task queue: eager starts stay on the process that asked.
      LOG_LEVEL: 'warn',
      RATE_LIMIT_REQUESTS: '100000000',
      // The benches create thousands of batches of one workspace (growth: 10,000).
      BATCH_CREATES_PER_MINUTE: '100000000',
      LIST_PAGES_PER_MINUTE: '100000000',
      RESULT_BYTES_PER_MINUTE: '1000gb',
      TEMPORAL_TASK_QUEUE: `bench-${name}`,
      // One API process unless a run asks for more (API_PROCESSES defaults to one per core).
      API_PROCESSES: '1',
      DATA_DIR: path.join(dataDir, name),
      ...env,
      ...extra,
    };
    const alone = opts.separateWorker && i === 0;
    const gateway = startProcess(name, process.execPath, [...nodeArgs, cli, 'api', ...(alone ? [] : ['--with-worker'])], gatewayEnv);
    if (alone) {
      gateways.worker = startProcess('worker', process.execPath, [cli, 'worker'], {
        ...gatewayEnv,
        DATA_DIR: path.join(dataDir, 'worker'),
        // Node options as docker-compose.yml runs the worker (its heap limit), unless BENCH_WORKER_NODE_OPTIONS says otherwise.
        NODE_OPTIONS: process.env.BENCH_WORKER_NODE_OPTIONS ?? composeWorkerNodeOptions(),
      });
    }
    const url = `http://127.0.0.1:${port}`;
    await gateway.waitUntil(
      async () => {
        if (!(await fetch(`${url}/readyz`)).ok) throw new Error('not yet');
      },
      60_000,
      'ready',
    );
    gateways[name] = gateway;
    gatewayUrls[name] = url;
  }
  const processes = { ...gateways, sandbox, temporal: temporal.process, ferretdb: ferret.process };
  return {
    dataDir,
    mongoUri: ferret.address,
    temporalAddress: temporal.address,
    sandboxUrl,
    gatewayUrl: Object.values(gatewayUrls)[0],
    gatewayUrls,
    processes,
    stop: async () => {
      await Promise.all(Object.values(processes).map((p) => p.stop()));
      fs.rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

/** The worker's NODE_OPTIONS in docker-compose.yml: the deployed worker's settings are the measured ones. */
function composeWorkerNodeOptions(): string {
  const compose = parse(fs.readFileSync(path.join(__dirname, '..', '..', 'docker-compose.yml'), 'utf8')) as {
    services: { worker: { environment: Record<string, string> } };
  };
  return compose.services.worker.environment.NODE_OPTIONS ?? '';
}

/** A workspace with ample credits in the stack's database, and an inference key for it. */
export async function benchKey(stack: Stack, workspace = 'bench'): Promise<string> {
  const store = await Store.connect(stack.mongoUri, 'gateway');
  try {
    const ws = await createWorkspace(store, workspace);
    await grantCredits(store, ws._id, 1_000_000);
    return (await createKey(store, ws._id, { kind: 'inference' })).key;
  } finally {
    await store.close();
  }
}

/** Each running process's CPU seconds (user + system, from /proc) and its children's pids. */
function processTable(): { cpu: Map<number, number>; children: Map<number, number[]> } {
  const cpu = new Map<number, number>();
  const children = new Map<number, number[]>();
  for (const d of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      // After the command's name: ppid is the 2nd field, utime and stime the 12th and 13th (clock ticks, 100 a second).
      const fields = fs.readFileSync(`/proc/${d}/stat`, 'utf8').split(') ')[1].split(' ');
      const pid = Number(d);
      const ppid = Number(fields[1]);
      cpu.set(pid, (Number(fields[11]) + Number(fields[12])) / 100);
      children.set(ppid, [...(children.get(ppid) ?? []), pid]);
    } catch {
      // gone meanwhile
    }
  }
  return { cpu, children };
}

/** CPU seconds of a process and every process under it (a gateway's API processes) in `table`. */
function treeCpu(table: ReturnType<typeof processTable>, pid: number | undefined): number {
  if (!pid) return 0;
  return (table.cpu.get(pid) ?? 0) + (table.children.get(pid) ?? []).reduce((s, child) => s + treeCpu(table, child), 0);
}

/**
 * CPU seconds a process and the processes under it have used so far. A child that exited is not
 * counted: none does during a measurement.
 */
export function cpuSeconds(pid: number | undefined): number {
  return treeCpu(processTable(), pid);
}

/** `cpuSeconds` of each named process, from one reading of /proc. */
export function cpuByProcess(processes: Record<string, { pid: number | undefined }>): Record<string, number> {
  const table = processTable();
  return Object.fromEntries(Object.entries(processes).map(([name, p]) => [name, treeCpu(table, p.pid)]));
}

export interface LoadResult {
  concurrency: number;
  requests: number;
  errors: number;
  seconds: number;
  rps: number;
  p50_ms: number;
  p90_ms: number;
  p99_ms: number;
}

function percentile(sorted: number[], q: number): number {
  return sorted.length ? sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)] : NaN;
}

/** Rounded to two decimals, as the results are written. */
export const round2 = (x: number) => Math.round(x * 100) / 100;

/** How many latencies, and their p50 and p99 (ms, two decimals). */
export function percentiles(ms: number[]) {
  const s = [...ms].sort((a, b) => a - b);
  const at = (q: number) => round2(percentile(s, q));
  return { n: s.length, p50_ms: at(0.5), p99_ms: at(0.99) };
}

/** Every latency of a closed-loop run, before it is summarised (runs can be merged first). */
export interface LoadSamples {
  concurrency: number;
  latencies: number[];
  errors: number;
  seconds: number;
}

/** `concurrency` workers each sending requests back to back until `total` are done (or `forMs` has passed). */
export async function loadSamples(
  url: string,
  body: unknown,
  headers: Record<string, string>,
  concurrency: number,
  total: number,
  check?: (status: number, text: string) => boolean,
  forMs = Infinity,
): Promise<LoadSamples> {
  const u = new URL(url);
  // One keep-alive connection per worker. A shared pool queued several of the first requests on
  // one connection while it was still being opened, so they ran one after another: at c=200 that
  // put up to 100 requests 0.3–5 s behind (the load generator's queue, not the server's time).
  const clients = Array.from({ length: concurrency }, () => new Client(u.origin, { pipelining: 1 }));
  const payload = JSON.stringify(body);
  const latencies: number[] = [];
  let errors = 0;
  let issued = 0;
  const started = performance.now();
  const deadline = started + forMs;
  await Promise.all(
    clients.map(async (client) => {
      while (issued < total && performance.now() < deadline) {
        issued++;
        const t0 = performance.now();
        const res = await client.request({
          path: u.pathname,
          method: 'POST',
          headers: { 'content-type': 'application/json', ...headers },
          body: payload,
        });
        const text = await res.body.text();
        latencies.push(performance.now() - t0);
        if (res.statusCode !== 200 || (check && !check(res.statusCode, text))) errors++;
      }
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  await Promise.all(clients.map((c) => c.close()));
  return { concurrency, latencies, errors, seconds };
}

/** Two runs of one target at one concurrency as one (rounds taking turns, merged). */
export function mergeSamples(acc: LoadSamples | undefined, run: LoadSamples): LoadSamples {
  if (!acc) return run;
  return {
    concurrency: run.concurrency,
    latencies: acc.latencies.concat(run.latencies),
    errors: acc.errors + run.errors,
    seconds: acc.seconds + run.seconds,
  };
}

export function summarize(s: LoadSamples): LoadResult {
  const latencies = [...s.latencies].sort((a, b) => a - b);
  return {
    concurrency: s.concurrency,
    requests: latencies.length,
    errors: s.errors,
    seconds: round2(s.seconds),
    rps: round2(latencies.length / s.seconds),
    p50_ms: round2(percentile(latencies, 0.5)),
    p90_ms: round2(percentile(latencies, 0.9)),
    p99_ms: round2(percentile(latencies, 0.99)),
  };
}

export interface RoundTarget {
  url: string;
  headers: Record<string, string>;
  body: object;
  /** Requests over all the rounds. */
  requests: number;
  /** Whether a 200's text is the answer expected (anything else counts as an error). */
  ok: (text: string) => boolean;
}

/** A target's merged latencies and errors, with each process's CPU milliseconds per request. */
export type MeasuredRow = LoadResult & { cpu_ms_per_request: Record<string, number> };

/** Load for `ms`, not measured, on connections of its own: wakes the target's processes (see ROUND_PRIMER_MS). */
export async function prime(url: string, body: unknown, headers: Record<string, string>, concurrency: number, ms: number): Promise<void> {
  await loadSamples(url, body, headers, concurrency, Infinity, undefined, ms);
}

/**
 * Load sent to a target before each of its rounds, not measured, on connections of its own. A
 * target rests while the others run, and on this machine a process woken after a rest runs slowly
 * for a while: a round trip to a process asleep for 50 ms or more took 0.5-0.9 ms against 0.15 back
 * to back (wake-rtt.ts), and the first 250-500 calls after a rest cost every process, the bare
 * sandbox included, up to twice the CPU of the calls after them. A round of a target under steady
 * traffic, what the rows describe, starts past that. The round's own connections are still new,
 * so a connection burst stays measured.
 */
const ROUND_PRIMER_MS = 500;

/**
 * Each target in turn, in `rounds` rounds of its requests / rounds (A B C, B C A, …): the machine's
 * speed drifts over minutes, and targets measured in one long block each would carry that drift
 * into the comparison. Latencies and CPU are merged over the rounds; each round follows a primer
 * (ROUND_PRIMER_MS).
 */
export async function measuredInRounds(
  stack: Stack,
  targets: Record<string, RoundTarget>,
  concurrency: number,
  rounds: number,
): Promise<Record<string, MeasuredRow>> {
  const names = Object.keys(targets);
  const samples: Record<string, LoadSamples> = {};
  const cpu: Record<string, Record<string, number>> = {};
  for (let round = 0; round < rounds; round++) {
    for (let i = 0; i < names.length; i++) {
      const name = names[(round + i) % names.length];
      const t = targets[name];
      await prime(t.url, t.body, t.headers, concurrency, ROUND_PRIMER_MS);
      const before = cpuByProcess(stack.processes);
      const run = await loadSamples(t.url, t.body, t.headers, concurrency, Math.ceil(t.requests / rounds), (_s, text) => t.ok(text));
      for (const [n, s] of Object.entries(cpuByProcess(stack.processes)))
        cpu[name] = { ...cpu[name], [n]: (cpu[name]?.[n] ?? 0) + s - before[n] };
      samples[name] = mergeSamples(samples[name], run);
    }
  }
  const rows: Record<string, MeasuredRow> = {};
  for (const name of names) {
    const run = summarize(samples[name]);
    const perRequest = Object.fromEntries(Object.entries(cpu[name]).map(([n, s]) => [n, Math.round((s / run.requests) * 1e5) / 100]));
    rows[name] = { ...run, cpu_ms_per_request: perRequest };
  }
  return rows;
}

export async function closedLoop(...args: Parameters<typeof loadSamples>): Promise<LoadResult> {
  return summarize(await loadSamples(...args));
}

export function writeResult(name: string, result: unknown): string {
  const dir = path.join(__dirname, '..', '..', 'bench', 'results');
  fs.mkdirSync(dir, { recursive: true });
  const file = path.join(dir, `${name}-${new Date().toISOString().replace(/[:.]/g, '-')}.json`);
  fs.writeFileSync(file, `${JSON.stringify(result, null, 2)}\n`);
  fs.writeFileSync(path.join(dir, `${name}-latest.json`), `${JSON.stringify(result, null, 2)}\n`);
  return file;
}
