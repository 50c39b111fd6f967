// Fault tests: a batch keeps running while each kind of process it depends on is killed with
// SIGKILL and started again (FerretDB, the Temporal dev server, the sandbox provider, the gateway
// itself). Each must end `completed` with exactly one result and one usage record per line, and
// counts a client sees never go backwards.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { MongoClient } from 'mongodb';
import { stack } from './fixture';
import { call, createTenant, startGatewayProcess, uniqueName, writeTestCatalog, type Tenant, storedUsage } from './helpers';
import { freePort, startProcess, type ManagedProcess } from '../devstack/processes';
import { startFerretDB, startTemporalServer } from '../devstack/services';
import { Store } from '../infrastructure/store';

const BIN = path.resolve(__dirname, '..', '..', 'bin', 'gateway.js');
const LINES = 60;

function faultCatalog(): string {
  return writeTestCatalog('faults', (base) => {
    base.providers.push({
      slug: 'fault-slow',
      name: 'fault-slow',
      adapter: 'openai',
      base_url: '${SANDBOX_URL}/~faults=1,latency=150/openai/v1',
      collects_data: false,
      zdr: false,
      max_concurrency: 6,
      timeout_ms: 5000,
    });
    base.models.push({
      id: 'test/fault-slow',
      name: 'fault-slow',
      kind: 'chat',
      family: 'test/fault-slow',
      version: '1',
      released: '20260101',
      context_length: 1000,
      distillable: true,
      endpoints: [
        {
          provider: 'fault-slow',
          upstream_model: 'sandbox-chat',
          pricing: { prompt: 1, completion: 1 },
          quantization: 'bf16',
          supported_parameters: [],
        },
      ],
    });
  });
}

interface Services {
  mongoUri: string;
  temporalAddress: string;
  sandboxUrl: string;
}

/** A gateway (API and worker) in a process of its own, so a crash of it is visible as an exit. */
function startGateway(name: string, services: Services, env: Record<string, string>): Promise<{ proc: ManagedProcess; url: string }> {
  const all = {
    ...env,
    MONGODB_URI: services.mongoUri,
    TEMPORAL_ADDRESS: services.temporalAddress,
    SANDBOX_URL: services.sandboxUrl,
    // A restarted gateway of the same name finds its usage journal.
    DATA_DIR: path.join(stack.tmpDir, `gateway-${name}`),
  };
  // /healthz, not /readyz: a gateway is started here while a dependency may be down.
  return startGatewayProcess(name, ['api', '--with-worker'], all, '/healthz');
}

/** Polls the batch until it is terminal, tolerating errors while a dependency is down; keeps every count seen. */
async function pollUntilTerminal(url: () => string, key: string, id: string, seen: number[], timeoutMs: number): Promise<any> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown = null;
  while (Date.now() < deadline) {
    try {
      const r = await call(`${url()}/api/v1/batches/${id}`, { key });
      last = r.body;
      if (r.status === 200) {
        seen.push(r.body.request_counts.completed + r.body.request_counts.failed);
        if (['completed', 'failed', 'cancelled', 'expired'].includes(r.body.status)) return r.body;
      }
    } catch (err) {
      last = String(err); // the gateway itself is down
    }
    await new Promise((res) => setTimeout(res, 200));
  }
  throw new Error(`batch ${id} not terminal in time: ${JSON.stringify(last).slice(0, 400)}`);
}

async function waitForCompleted(url: string, key: string, id: string, atLeast: number): Promise<void> {
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    const r = await call(`${url}/api/v1/batches/${id}`, { key });
    if (r.body?.request_counts?.completed >= atLeast) return;
    await new Promise((res) => setTimeout(res, 100));
  }
  throw new Error('batch did not make progress');
}

/** /readyz answers 503 within a second, naming the part that is down. */
async function expectNotReady(url: string, part: 'mongodb' | 'temporal'): Promise<void> {
  const started = Date.now();
  const res = await fetch(`${url}/readyz`);
  expect(Date.now() - started).to.be.lessThan(1000);
  expect(res.status).to.equal(503);
  expect(((await res.json()) as any).error.metadata[part]).to.equal('unavailable');
}

describe('faults: a running batch survives each process being killed', function () {
  this.timeout(240_000);
  let catalogPath: string;
  before(() => {
    catalogPath = faultCatalog();
  });

  /**
   * Starts a gateway on `services` (`settings` added to its environment), runs a batch, and once 10
   * lines are done calls `fault` (which kills something and starts it again), then checks the
   * batch's outcome.
   */
  async function survives(
    services: Services,
    fault: (
      gw: { proc: ManagedProcess; url: string },
      env: Record<string, string>,
    ) => Promise<{ proc: ManagedProcess; url: string } | void>,
    settings: Record<string, string> = {},
  ) {
    const env = {
      PORT: String(await freePort()),
      MONGODB_DATABASE: uniqueName('db').replace(/-/g, '_'),
      TEMPORAL_TASK_QUEUE: uniqueName('tq'),
      CATALOG_PATH: catalogPath,
      BATCH_CHUNK_SIZE: '10',
      BATCH_WINDOW: '2',
      ...settings,
    };
    let gw = await startGateway('gateway', services, env);
    const store = await Store.connect(services.mongoUri, env.MONGODB_DATABASE);
    try {
      const t: Tenant = await createTenant(store, 10);
      const requests = Array.from({ length: LINES }, (_, i) => ({
        custom_id: `line-${i}`,
        body: { messages: [{ role: 'user', content: `Question ${i}` }], max_tokens: 5 },
      }));
      const created = await call(`${gw.url}/api/v1/batches`, {
        key: t.inferenceKey,
        body: { endpoint: '/v1/chat/completions', model: 'test/fault-slow', requests },
      });
      expect(created.status, JSON.stringify(created.body)).to.equal(202);
      await waitForCompleted(gw.url, t.inferenceKey, created.body.id, 10);

      const seen: number[] = [];
      const replaced = await fault(gw, env);
      if (replaced) gw = replaced;
      const done = await pollUntilTerminal(() => gw.url, t.inferenceKey, created.body.id, seen, 180_000).catch((err: Error) => {
        // What the gateway said meanwhile: a batch that stalls here is otherwise a mystery.
        throw new Error(`${err.message}\ncounts seen: ${seen.join(',')}\n${gw.proc.recentOutput()}`);
      });

      expect(gw.proc.hasExited, `the gateway died:\n${gw.proc.recentOutput()}`).to.equal(false);
      expect(done.status, JSON.stringify(done.error)).to.equal('completed');
      expect(done.request_counts).to.deep.equal({ total: LINES, completed: LINES, failed: 0 });
      const customIds = done.results.map((r: any) => r.custom_id);
      expect(customIds).to.have.length(LINES);
      expect(new Set(customIds).size).to.equal(LINES);
      const billed = await storedUsage(store, { batch_id: created.body.id });
      expect(billed).to.have.length(LINES);
      expect(done.usage.cost).to.be.closeTo(
        billed.reduce((a, u) => a + u.cost, 0),
        1e-9,
      );
      // Live counts never went backwards.
      for (let i = 1; i < seen.length; i++) expect(seen[i], `counts seen: ${seen.join(',')}`).to.be.at.least(seen[i - 1]);
    } finally {
      await store.close().catch(() => undefined);
      await gw.proc.stop();
    }
  }

  const shared = (): Services => ({ mongoUri: stack.mongoUri, temporalAddress: stack.temporalAddress, sandboxUrl: stack.sandboxUrl });

  it('FerretDB killed and restarted: the gateway stays up and the batch completes', async () => {
    const port = await freePort();
    const dataDir = path.join(stack.tmpDir, uniqueName('ferret-fault'));
    let ferret = await startFerretDB({ binary: stack.tools!.ferretdb, port, dataDir });
    try {
      await survives({ ...shared(), mongoUri: ferret.address }, async (gw) => {
        await ferret.process.kill();
        await expectNotReady(gw.url, 'mongodb');
        await new Promise((res) => setTimeout(res, 3000)); // writes in flight fail meanwhile
        ferret = await startFerretDB({ binary: stack.tools!.ferretdb, port, dataDir });
      });
    } finally {
      await ferret.process.stop();
    }
  });

  it('a FerretDB killed while it created a collection (its table made, its metadata not) takes the next insert into it, with its _id index', async function () {
    // The state such a kill leaves, made directly in FerretDB's SQLite file: python3's sqlite3
    // module writes it (Node 20 has no SQLite). A full run saw a batch stall on it for good.
    const python = spawnSync('python3', ['-c', 'import sqlite3'], { encoding: 'utf8' });
    if (python.status !== 0) this.skip();
    const port = await freePort();
    const dataDir = path.join(stack.tmpDir, uniqueName('ferret-create'));
    const insert = async (collection: string, id: string) => {
      const ferret = await startFerretDB({ binary: stack.tools!.ferretdb, port, dataDir });
      const client = new MongoClient(ferret.address, { directConnection: true, retryWrites: false });
      try {
        await client.connect();
        return await client
          .db('cut')
          .collection(collection)
          .insertOne({ _id: id } as never)
          .then(
            () => 'inserted',
            (err: { code?: number; message: string }) => (err.code === 11000 ? 'duplicate' : err.message),
          );
      } finally {
        await client.close();
        await ferret.process.stop();
      }
    };
    expect(await insert('first', 'a')).to.equal('inserted'); // the database's file
    // FerretDB names a collection's table `<name>_<FNV-1a of the name>`.
    let h = 0x811c9dc5;
    for (const b of Buffer.from('batch_pages')) h = Math.imul(h ^ b, 0x01000193) >>> 0;
    const table = `batch_pages_${h.toString(16).padStart(8, '0')}`;
    const made = spawnSync(
      'python3',
      [
        '-c',
        `import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute(sys.argv[2]); c.commit()`,
        path.join(dataDir, 'cut.sqlite'),
        `CREATE TABLE "${table}" (_ferretdb_sjson TEXT NOT NULL CHECK(_ferretdb_sjson != '')) STRICT`,
      ],
      { encoding: 'utf8' },
    );
    expect(made.status, made.stderr).to.equal(0);
    // Before the build's patch: "table batch_pages_e3299e5c already exists", on every insert.
    expect(await insert('batch_pages', 'p1')).to.equal('inserted');
    expect(await insert('batch_pages', 'p1')).to.equal('duplicate');
  });

  it('Temporal killed and restarted: the batch completes', async () => {
    const port = await freePort();
    const dbFile = path.join(stack.tmpDir, uniqueName('temporal-fault'), 'temporal.db');
    const start = () => startTemporalServer({ binary: stack.tools!.temporal, port, uiPort: null, dbFile, namespace: stack.namespace });
    let temporal = await start();
    try {
      await survives({ ...shared(), temporalAddress: temporal.address }, async (gw) => {
        await temporal.process.kill();
        await expectNotReady(gw.url, 'temporal');
        await new Promise((res) => setTimeout(res, 1000));
        temporal = await start();
      });
    } finally {
      await temporal.process.stop();
    }
  });

  it('the sandbox provider killed and restarted: lines in flight are retried and billed once', async () => {
    const port = await freePort();
    const start = async () => {
      const p = startProcess('sandbox-fault', process.execPath, [BIN, 'sandbox'], {
        ...process.env,
        SANDBOX_PORT: String(port),
        LOG_LEVEL: 'warn',
      });
      await p.waitUntil(
        async () => {
          if (!(await fetch(`http://127.0.0.1:${port}/healthz`)).ok) throw new Error('not yet');
        },
        15_000,
        'answering',
      );
      return p;
    };
    let sandbox = await start();
    try {
      await survives({ ...shared(), sandboxUrl: `http://127.0.0.1:${port}` }, async () => {
        await sandbox.kill();
        await new Promise((res) => setTimeout(res, 2000));
        sandbox = await start();
      });
    } finally {
      await sandbox.stop();
    }
  });

  it('the gateway itself killed and started again: the batch completes', async () => {
    // The killed worker's chunks move on after 3 s of silence instead of the default 10 s.
    await survives(
      shared(),
      async (gw, env) => {
        await gw.proc.kill();
        return startGateway('gateway-2', shared(), env);
      },
      { BATCH_HEARTBEAT_TIMEOUT_MS: '3000' },
    );
  });
});
