// `gateway start`: the whole gateway on loopback. Services named by MONGODB_URI or TEMPORAL_ADDRESS
// are used as they are; the missing ones are started from the tools cache, with data in DATA_DIR,
// and supervised: restarted when they exit, given up on (and everything stopped) when they keep
// crashing. Each runs under a watchdog, so none outlives this process.
import net from 'node:net';
import path from 'node:path';
import { metricsExposure, type Config } from '../infrastructure/config';
import type { Logger } from '../infrastructure/log';
import { ensureTools } from '../devstack/binaries';
import { startFerretDB, startTemporalServer } from '../devstack/services';
import { startProcess, type ManagedProcess } from '../devstack/processes';
import { Supervisor } from '../devstack/supervisor';
import { RunRecord } from '../devstack/run-file';
import { runApiRole } from './roles';
import { startApiProcesses } from './api-processes';
import { shutdownDeadlineMs, stopOnSignals, type Stop } from './signals';
import { Store } from '../infrastructure/store';
import { bootstrapIfEmpty } from '../domain/accounts/bootstrap';

/**
 * Fails with a clear message when a port we are about to use is already taken (a gateway left
 * running?). A port is given a few seconds to be let go of first, as a process that just died does.
 */
async function assertPortsFree(ports: [string, string, number][], waitMs = 3_000): Promise<void> {
  const deadline = Date.now() + waitMs;
  for (const [setting, host, port] of ports) {
    for (;;) {
      const err = await new Promise<NodeJS.ErrnoException | null>((resolve) => {
        const probe = net.createServer();
        probe.once('error', resolve);
        probe.listen(port, host, () => probe.close(() => resolve(null)));
      });
      if (!err) break;
      if (err.code === 'EADDRINUSE' && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 100));
        continue;
      }
      throw new Error(
        err.code === 'EADDRINUSE'
          ? `port ${port} (${setting}) is already in use on ${host}: is another gateway still running? Stop it, or set ${setting} to a free port`
          : `cannot use port ${port} (${setting}) on ${host}: ${err.message}`,
      );
    }
  }
}

export async function startAll(config: Config, logger: Logger): Promise<void> {
  // Progress goes through the logger too: one format per destination.
  const say = (line: string) => logger.info(line);
  const stops: Stop[] = [];
  let supervisor: Supervisor | null = null;
  // Something that keeps crashing stops everything started, newest first, and the gateway exits 1.
  const shutdown = stopOnSignals(logger, stops, {
    deadlineMs: shutdownDeadlineMs(config.http.shutdownGraceMs),
    first: () => supervisor?.halt(),
  });
  const embeddedMongo = !config.mongo.uri;
  const embeddedTemporal = !config.temporal.address;
  // Whatever an earlier run left (its gateway killed a moment ago, its children still dying) is
  // stopped and waited for first: the ports and data files are ours before anything starts.
  const run = new RunRecord(config.dataDir);
  const cleared = await run.clearLeftovers();
  if (cleared.length) say(`stopped what an earlier run left running: ${cleared.join(', ')}`);
  await assertPortsFree([
    ...(embeddedMongo ? [['FERRETDB_PORT', '127.0.0.1', config.mongo.embeddedPort] as [string, string, number]] : []),
    ...(embeddedTemporal
      ? ([
          ['TEMPORAL_PORT', '127.0.0.1', config.temporal.embeddedPort],
          ['TEMPORAL_UI_PORT', '127.0.0.1', config.temporal.uiPort],
        ] as [string, string, number][])
      : []),
    ['SANDBOX_PORT', '127.0.0.1', config.sandbox.port],
    ['PORT', config.host, config.port],
  ]);
  const tools = await ensureTools(config.toolsDir, { temporal: embeddedTemporal, ferretdb: embeddedMongo }, say);

  supervisor = new Supervisor(logger, (part, message) => {
    logger.fatal({ part }, 'embedded process keeps crashing; stopping the gateway');
    say(message);
    shutdown(1);
  });
  stops.push(async () => {
    await supervisor!.stop();
    run.remove();
  });
  /** Starts a part and records its pid, so a later start can clear it if this run dies. */
  const recorded = (name: string, command: string, start: () => Promise<ManagedProcess>) => async (): Promise<ManagedProcess> => {
    const p = await start();
    run.child(name, p.pid, command);
    return p;
  };

  const mongoUri = embeddedMongo ? `mongodb://127.0.0.1:${config.mongo.embeddedPort}/` : config.mongo.uri!;
  const temporalAddress = embeddedTemporal ? `127.0.0.1:${config.temporal.embeddedPort}` : config.temporal.address!;
  const ferretDir = path.join(config.dataDir, 'ferretdb');
  await Promise.all([
    embeddedMongo &&
      supervisor
        .keep(
          'ferretdb',
          recorded(
            'ferretdb',
            tools.ferretdb,
            async () => (await startFerretDB({ binary: tools.ferretdb, port: config.mongo.embeddedPort, dataDir: ferretDir })).process,
          ),
        )
        .then(() => say(`FerretDB (MongoDB wire protocol) on ${mongoUri} — data in ${ferretDir}`)),
    embeddedTemporal &&
      supervisor
        .keep(
          'temporal',
          recorded(
            'temporal',
            tools.temporal,
            async () =>
              (
                await startTemporalServer({
                  binary: tools.temporal,
                  port: config.temporal.embeddedPort,
                  uiPort: config.temporal.uiPort,
                  dbFile: path.join(config.dataDir, 'temporal.db'),
                  namespace: config.temporal.namespace,
                })
              ).process,
          ),
        )
        .then(() =>
          say(
            `Temporal dev server on ${temporalAddress} — Web UI http://127.0.0.1:${config.temporal.uiPort} (loopback only: it has no authentication; to reach it from elsewhere, put an authenticating proxy in front)`,
          ),
        ),
  ]);

  // The sandbox provider runs in its own process, as a real upstream would.
  const sandboxUrl = `http://127.0.0.1:${config.sandbox.port}`;
  await supervisor.keep(
    'sandbox',
    recorded('sandbox', 'sandbox', async () => {
      const sandbox = startProcess('sandbox', process.execPath, [path.join(__dirname, 'index.js'), 'sandbox'], process.env);
      await sandbox.waitUntil(
        async () => {
          const res = await fetch(`${sandboxUrl}/healthz`);
          if (!res.ok) throw new Error(`status ${res.status}`);
        },
        15_000,
        `answering on ${sandboxUrl}`,
      );
      return sandbox;
    }),
  );
  say(`sandbox provider on ${sandboxUrl}`);

  const store = await Store.connect(mongoUri, config.mongo.database);
  const first = await bootstrapIfEmpty(store, config.credits.welcomeUsd).finally(() => store.close());
  if (first) {
    say(
      `created workspace "default" with $${config.credits.welcomeUsd} of credits and its first management key (shown once, store it now):`,
    );
    say(`  ${first.key}`);
  }

  const workerBeside = config.decisions.execution === 'inline';
  const api =
    config.apiProcesses > 1
      ? await startApiProcesses({
          count: config.apiProcesses,
          // Decisions as workflows start eagerly on the API process's own worker; otherwise the
          // worker runs beside the API processes, so batch lines take no turns of their event loops.
          args: ['api', ...(workerBeside ? [] : ['--with-worker'])],
          worker: workerBeside,
          env: { ...process.env, MONGODB_URI: mongoUri, TEMPORAL_ADDRESS: temporalAddress },
          logger,
          temporalMetricsPort: config.metrics.temporalPort,
          shutdownGraceMs: config.http.shutdownGraceMs,
          embedded: () => supervisor.status(),
          giveUp: (message) => {
            logger.fatal(message);
            shutdown(1);
          },
        })
      : await runApiRole(config, logger, { mongoUri, temporalAddress }, { withWorker: true, embedded: () => supervisor.status() });
  stops.push(api.stop);
  say(
    config.apiProcesses > 1
      ? `${config.apiProcesses} API processes sharing the port (API_PROCESSES), ${workerBeside ? 'and a worker process' : 'each with a worker'} polling task queue "${config.temporal.taskQueue}"`
      : `worker polling task queue "${config.temporal.taskQueue}"`,
  );
  say(
    `API on ${api.url}/api/v1 (health: ${api.url}/readyz) — decisions run ${config.decisions.execution === 'inline' ? 'inline, in the API process' : 'as Temporal workflows'} (DECISIONS_EXECUTION)`,
  );
  // Not served at all (an API beyond loopback without a token): the API role has said so already.
  const metrics = metricsExposure(config);
  if (metrics.where !== 'none') {
    const url = metrics.where === 'api' ? api.url : `http://${config.metrics.host}:${config.metrics.port}`;
    const guard =
      metrics.protectedBy === 'token'
        ? 'behind METRICS_TOKEN'
        : metrics.protectedBy === 'loopback'
          ? 'loopback only; set METRICS_TOKEN before exposing it: it names every workspace and its spend'
          : 'OPEN to the network: set METRICS_TOKEN';
    say(`metrics on ${url}/metrics (${guard})`);
  }
  say(`ready — Ctrl-C stops everything`);
}
