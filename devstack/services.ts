// The embedded default stack: a Temporal dev server and FerretDB on loopback, with their data in
// a directory of ours so a restart reuses it.
import fs from 'node:fs';
import path from 'node:path';
import { MongoClient } from 'mongodb';
import { Connection } from '@temporalio/client';
import { searchAttributes } from '../workflows/shared';
import { freePort, startProcess, tcpReachable, type ManagedProcess } from './processes';

export interface RunningService {
  process: ManagedProcess;
  /** Address a client connects to: host:port for Temporal, a mongodb:// URI for FerretDB. */
  address: string;
}

export interface TemporalServerOptions {
  binary: string;
  port: number;
  /** Web UI port, or null for a headless server (tests). */
  uiPort: number | null;
  /** SQLite file for persistence, or null for an in-memory server. */
  dbFile: string | null;
  namespace: string;
  /** Dynamic config (default TEMPORAL_DYNAMIC_CONFIG): the fairness bench measures a server without it too. */
  dynamicConfig?: Record<string, string | number | boolean>;
}

/**
 * The Temporal server settings the gateway relies on (docker-compose's server reads the same, from
 * deploy/temporal-dynamic-config.yaml). Fairness: batch workflows carry their workspace as fairness
 * key, and a backlog is dispatched a workspace at a time, in turn, not first come, first served. One
 * partition per task queue, since fairness is kept within each partition. Eager activities: an
 * activity a workflow task schedules on the worker's own queue comes back in the answer to that
 * task when the worker has a free slot, without a trip through matching: a small batch costs
 * Temporal less (docs/performance.md). Chunks of larger batches opt out (workflows/batch.ts), to
 * stay fair.
 */
export const TEMPORAL_DYNAMIC_CONFIG = {
  'matching.enableFairness': true,
  'matching.numTaskqueueReadPartitions': 1,
  'matching.numTaskqueueWritePartitions': 1,
  'system.enableActivityEagerExecution': true,
} as const;

export async function startTemporalServer(opts: TemporalServerOptions): Promise<RunningService> {
  const args = [
    'server',
    'start-dev',
    '--ip',
    '127.0.0.1',
    '--port',
    String(opts.port),
    '--namespace',
    opts.namespace,
    '--log-level',
    'warn',
  ];
  // Its HTTP API on a port of ours: left to itself it takes one from the ephemeral range, which an
  // outgoing connection may take first (see freePort).
  args.push('--http-port', String(await freePort()));
  // The Web UI has no authentication: loopback, like the server itself.
  args.push(...(opts.uiPort === null ? ['--headless'] : ['--ui-ip', '127.0.0.1', '--ui-port', String(opts.uiPort)]));
  if (opts.dbFile) {
    fs.mkdirSync(path.dirname(opts.dbFile), { recursive: true });
    // WAL with synchronous=normal: no corruption on a crash, far fewer fsyncs per workflow step
    // (a power loss may drop the last moments, acceptable for the embedded dev stack).
    args.push('--db-filename', opts.dbFile, '--sqlite-pragma', 'journal_mode=wal', '--sqlite-pragma', 'synchronous=normal');
  }
  for (const [key, value] of Object.entries(opts.dynamicConfig ?? TEMPORAL_DYNAMIC_CONFIG))
    args.push('--dynamic-config-value', `${key}=${value}`);
  for (const key of Object.values(searchAttributes)) {
    args.push('--search-attribute', `${key.name}=${key.type === 'KEYWORD' ? 'Keyword' : key.type}`);
  }
  const proc = startProcess('temporal', opts.binary, args);
  const address = `127.0.0.1:${opts.port}`;
  await proc.waitUntil(
    async () => {
      await tcpReachable('127.0.0.1', opts.port);
      const conn = await Connection.connect({ address, connectTimeout: 1_000 });
      try {
        await conn.workflowService.describeNamespace({ namespace: opts.namespace });
      } finally {
        await conn.close();
      }
    },
    60_000,
    `answering on ${address}`,
  );
  return { process: proc, address };
}

export interface FerretOptions {
  binary: string;
  port: number;
  /** Directory for the SQLite files (one per database). */
  dataDir: string;
  /**
   * The environment it starts with (this process's by default); its GOGC wins over FERRETDB_GOGC,
   * and a FERRETDB_DEBUG_ADDR in it turns on FerretDB's debug listener (metrics, pprof), off otherwise.
   */
  env?: NodeJS.ProcessEnv;
}

/**
 * FerretDB's Go garbage collector runs when its heap has grown by this percentage (Go's GOGC; its
 * default is 100). Every billed call ends in FerretDB, as its share of a usage insert: a record
 * cost it 49-56 µs of CPU at 100 and 34-41 µs at 400, for a peak of 50 MB of memory instead of 38
 * (`npm run bench ferretdb`); in the proxy's path at c=50, 0.087-0.102 ms a call against 0.058-0.084
 * (probes). 800 saved no more. The Temporal dev server stays at Go's default: at 400 its memory
 * doubled and its CPU did not drop. A GOGC in the environment still wins.
 */
export const FERRETDB_GOGC = '400';

export async function startFerretDB(opts: FerretOptions): Promise<RunningService> {
  fs.mkdirSync(opts.dataDir, { recursive: true });
  const env = opts.env ?? process.env;
  const proc = startProcess(
    'ferretdb',
    opts.binary,
    [
      '--handler=sqlite',
      // WAL is FerretDB's default; synchronous=normal drops the fsync per transaction (still no
      // corruption on a crash), the same trade as for the dev Temporal server.
      `--sqlite-url=file:${path.resolve(opts.dataDir)}/?_pragma=journal_mode(wal)&_pragma=busy_timeout(10000)&_pragma=auto_vacuum(none)&_pragma=synchronous(normal)`,
      `--listen-addr=127.0.0.1:${opts.port}`,
      '--state-dir=-',
      '--telemetry=disable',
      '--log-level=warn',
    ],
    { ...env, DO_NOT_TRACK: 'true', GOGC: env.GOGC ?? FERRETDB_GOGC, FERRETDB_DEBUG_ADDR: env.FERRETDB_DEBUG_ADDR ?? '-' },
  );
  const address = `mongodb://127.0.0.1:${opts.port}/`;
  await proc.waitUntil(
    async () => {
      await tcpReachable('127.0.0.1', opts.port);
      const client = new MongoClient(address, { serverSelectionTimeoutMS: 1_000 });
      try {
        await client.db('admin').command({ ping: 1 });
      } finally {
        await client.close();
      }
    },
    30_000,
    `answering on ${address}`,
  );
  return { process: proc, address };
}
