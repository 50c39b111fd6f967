// `gateway start`: the whole gateway on loopback. Services named by MONGODB_URI or TEMPORAL_ADDRESS
// are used as they are; the missing ones are started from the tools cache, with data in DATA_DIR.
import path from 'node:path';
import type { Config } from '../config';
import type { Logger } from '../log';
import { ensureTools } from '../tools/binaries';
import { startFerretDB, startTemporalServer } from '../tools/services';
import { startProcess } from '../tools/processes';
import { runApiRole, stopOnSignals, type Stop } from './roles';
import { Store } from '../store';
import { bootstrapIfEmpty } from '../accounts/bootstrap';

const say = (line: string) => process.stdout.write(`gateway ▸ ${line}\n`);

export async function startAll(config: Config, logger: Logger): Promise<void> {
  const stops: Stop[] = [];
  stopOnSignals(logger, stops);
  const tools = await ensureTools(config.toolsDir, { temporal: !config.temporal.address, ferretdb: !config.mongo.uri }, say);

  const [mongoUri, temporalAddress] = await Promise.all([
    (async () => {
      if (config.mongo.uri) return config.mongo.uri;
      const ferret = await startFerretDB({ binary: tools.ferretdb, port: config.mongo.embeddedPort, dataDir: path.join(config.dataDir, 'ferretdb') });
      stops.push(() => ferret.process.stop());
      say(`FerretDB (MongoDB wire protocol) on ${ferret.address} — data in ${path.join(config.dataDir, 'ferretdb')}`);
      return ferret.address;
    })(),
    (async () => {
      if (config.temporal.address) return config.temporal.address;
      const temporal = await startTemporalServer({
        binary: tools.temporal,
        port: config.temporal.embeddedPort,
        uiPort: config.temporal.uiPort,
        dbFile: path.join(config.dataDir, 'temporal.db'),
        namespace: config.temporal.namespace,
      });
      stops.push(() => temporal.process.stop());
      say(`Temporal dev server on ${temporal.address} — Web UI http://127.0.0.1:${config.temporal.uiPort}`);
      return temporal.address;
    })(),
  ]);

  // The sandbox provider runs in its own process, as a real upstream would.
  const sandbox = startProcess('sandbox', process.execPath, [path.join(__dirname, 'index.js'), 'sandbox'], process.env);
  stops.push(() => sandbox.stop());
  const sandboxUrl = `http://127.0.0.1:${config.sandbox.port}`;
  await sandbox.waitUntil(async () => {
    const res = await fetch(`${sandboxUrl}/healthz`);
    if (!res.ok) throw new Error(`status ${res.status}`);
  }, 15_000, `answering on ${sandboxUrl}`);
  say(`sandbox provider on ${sandboxUrl}`);

  const store = await Store.connect(mongoUri, config.mongo.database);
  const first = await bootstrapIfEmpty(store, config.credits.welcomeUsd).finally(() => store.close());
  if (first) {
    say(`created workspace "default" with $${config.credits.welcomeUsd} of credits and its first management key (shown once, store it now):`);
    say(`  ${first.key}`);
  }

  const api = await runApiRole(config, logger, { mongoUri, temporalAddress }, { withWorker: true });
  stops.push(api.stop);
  say(`worker polling task queue "${config.temporal.taskQueue}"`);
  say(`API on ${api.url}/api/v1 (health: ${api.url}/readyz) — decisions run ${config.decisions.execution === 'inline' ? 'inline, in the API process' : 'as Temporal workflows'} (DECISIONS_EXECUTION)`);
  say(`ready — Ctrl-C stops everything`);
}
