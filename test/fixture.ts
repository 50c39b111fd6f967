// Mocha global fixture: one real Temporal dev server and one real FerretDB per test run, on free
// ports, stopped at the end. TEMPORAL_ADDRESS / MONGODB_URI point the run at existing servers instead.
// First, as in the gateway's entry (cli/index.ts): before any Temporal package loads.
import '../infrastructure/temporal/activity-context';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { defaultToolsDir } from '../infrastructure/config';
import { ensureTools, type ToolPaths } from '../devstack/binaries';
import { freePort, startProcess, type ManagedProcess } from '../devstack/processes';
import { startFerretDB, startTemporalServer, type RunningService } from '../devstack/services';

export const stack = {
  mongoUri: '',
  temporalAddress: '',
  namespace: 'default',
  /** The sandbox provider, in a process of its own as in production. */
  sandboxUrl: '',
  tools: null as ToolPaths | null,
  tmpDir: '',
};

// Under `mocha --parallel` the global setup runs in the main process and the test files in worker
// processes forked after it: the workers read the running stack from the environment they inherit.
const STACK_ENV = 'GATEWAY_TEST_STACK';
if (process.env[STACK_ENV]) Object.assign(stack, JSON.parse(process.env[STACK_ENV]));

const running: RunningService[] = [];
let sandbox: ManagedProcess | null = null;

export async function mochaGlobalSetup(): Promise<void> {
  stack.tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), 'gateway-test-'));
  const external = { mongo: process.env.MONGODB_URI, temporal: process.env.TEMPORAL_ADDRESS };
  // Tests that start their own FerretDB (readiness after a database dies) need the binary anyway.
  stack.tools = await ensureTools(process.env.TOOLS_DIR ?? defaultToolsDir(), { temporal: !external.temporal, ferretdb: true }, (line) =>
    process.stderr.write(`  [tools] ${line}\n`),
  );
  const [mongo, temporal] = await Promise.all([
    external.mongo
      ? null
      : startFerretDB({ binary: stack.tools.ferretdb, port: await freePort(), dataDir: path.join(stack.tmpDir, 'ferretdb') }),
    external.temporal
      ? null
      : startTemporalServer({
          binary: stack.tools.temporal,
          port: await freePort(),
          uiPort: null,
          dbFile: null,
          namespace: stack.namespace,
        }),
  ]);
  for (const s of [mongo, temporal]) if (s) running.push(s);
  const sandboxPort = await freePort();
  sandbox = startProcess('sandbox', process.execPath, [path.join(__dirname, '..', 'cli', 'index.js'), 'sandbox'], {
    ...process.env,
    SANDBOX_PORT: String(sandboxPort),
    LOG_LEVEL: 'warn',
  });
  stack.sandboxUrl = `http://127.0.0.1:${sandboxPort}`;
  await sandbox.waitUntil(
    async () => {
      if (!(await fetch(`${stack.sandboxUrl}/healthz`)).ok) throw new Error('not yet');
    },
    15_000,
    'answering',
  );
  stack.mongoUri = external.mongo ?? mongo!.address;
  stack.temporalAddress = external.temporal ?? temporal!.address;
  process.env[STACK_ENV] = JSON.stringify(stack);
}

export async function mochaGlobalTeardown(): Promise<void> {
  await Promise.all([...running.map((s) => s.process.stop()), sandbox?.stop()]);
  fs.rmSync(stack.tmpDir, { recursive: true, force: true });
}
