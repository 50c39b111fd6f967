// A batch's workflow is started before the batch is stored, and the batch is visible only once its
// document is stored after that: a visible batch always has a workflow, and a workflow whose batch
// is never stored (the API failed or died in between, or the start's answer was lost) runs nothing.
import { spawn } from 'node:child_process';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { expect } from 'chai';
import { Client, Connection, WorkflowClient, WorkflowNotFoundError } from '@temporalio/client';
import { Collection, MongoServerError } from 'mongodb';
import {
  abandonBatch,
  BatchAbandonedError,
  createBatch,
  publishBatch,
  readNewBatch,
  readBatch,
  storeBatchLines,
  type BatchDoc,
} from '../domain/batches/store';
import { batchChunks } from '../domain/batches/inputs';
import { packLines } from '../domain/batches/packed-lines';
import { endpointEntry, modelEntry, providerEntry } from '../domain/catalog/entries';
import { batchWorkflow, batchWorkflowStart } from '../workflows/batch';
import { searchAttributes } from '../workflows/shared';
import { stack } from './fixture';
import { until } from './until';
import { capturingLogger } from './capture-log';
import { recoverIfTemporalIsNew } from '../cli/recover';
import { BatchRuns } from '../api/batch-runs';
import { Catalog } from '../domain/catalog';
import { Store } from '../infrastructure/store';
import {
  call,
  createTenant,
  startTestGateway,
  storedUsage,
  testBatchDoc,
  writeTestCatalog,
  waitForStatus,
  type Tenant,
  type TestGateway,
} from './helpers';

const MODEL = 'test/creation-counted';
/** One line at a time, 300 ms each: a batch that is still running when it is cancelled. */
const SLOW = 'test/creation-slow';
/** As SLOW, on a provider of its own: a batch stopped while its lines run, counted apart. */
const STOPPED = 'test/creation-stopped';
/** A batch still running whenever the recovery looks, however slowly the machine starts its command. */
const LONG = 'test/creation-long';
const line = (i: number) => ({
  custom_id: `req-${i}`,
  body: JSON.stringify({ messages: [{ role: 'user', content: `q${i}` }], max_tokens: 5 }),
});

/** Calls the sandbox has had for this file's model. */
const providerCalls = async (tag = 'creationtest=1') =>
  Object.entries((await (await fetch(`${stack.sandboxUrl}/_calls`)).json()) as Record<string, number>)
    .filter(([k]) => k.includes(tag))
    .reduce((a, [, n]) => a + n, 0);

describe('batch creation: the workflow and the lines, then the batch visible last', function () {
  this.timeout(60_000);
  let gw: TestGateway;
  let t: Tenant;
  let connection: Connection;
  let client: Client;

  before(async () => {
    const catalog = writeTestCatalog('batch-creation', (c) => {
      c.providers.push(
        providerEntry('creation-counted', `\${SANDBOX_URL}/~creationtest=1/openai/v1`),
        providerEntry('creation-slow', `\${SANDBOX_URL}/~creationslow=1,latency=300/openai/v1`, { max_concurrency: 1 }),
        providerEntry('creation-stopped', `\${SANDBOX_URL}/~creationstopped=1,latency=300/openai/v1`, { max_concurrency: 1 }),
        providerEntry('creation-long', `\${SANDBOX_URL}/~creationlong=1,latency=1000/openai/v1`, { max_concurrency: 1 }),
      );
      c.models.push(modelEntry(LONG, [endpointEntry('creation-long', 1, { upstream_model: 'sandbox-chat' })], { context_length: 1000 }));
      c.models.push(
        modelEntry(STOPPED, [endpointEntry('creation-stopped', 1, { upstream_model: 'sandbox-chat' })], { context_length: 1000 }),
      );
      c.models.push(modelEntry(SLOW, [endpointEntry('creation-slow', 1, { upstream_model: 'sandbox-chat' })], { context_length: 1000 }));
      c.models.push(
        modelEntry(MODEL, [endpointEntry('creation-counted', 1, { upstream_model: 'sandbox-chat' })], { context_length: 1000 }),
      );
    });
    // A batch whose document does not come is given up after 1.5 s here (10 minutes in production).
    gw = await startTestGateway({
      env: { CATALOG_PATH: catalog, WEBHOOKS_ALLOW_PRIVATE_URLS: 'true' },
      tune: (c) => {
        c.batches.createdWithinMs = 1_500;
        c.temporal.answerWithinMs = 2_000; // 10 s in production
        // Its worker looks for runs stopped in Temporal once, at start: the runs this file stops are
        // left to what each test checks (the test of that look starts a gateway of its own).
        c.batches.stoppedRunsEveryMs = 3_600_000;
        // A run that follows a stopped one waits this long for its work to stop (10 s by default).
        c.batches.heartbeatTimeoutMs = 2_000;
      },
    });
    t = await createTenant(gw.store, 5);
    connection = await Connection.connect({ address: stack.temporalAddress });
    client = new Client({ connection });
  });
  after(async () => {
    await connection.close();
    await gw.stop();
  });

  /** A new batch of `n` lines in chunks of `chunkSize`: its document, unstored, and its lines. */
  const newBatch = (n: number, chunkSize: number) => {
    const lines = packLines(Array.from({ length: n }, (_, i) => line(i)));
    const doc: BatchDoc = testBatchDoc(t, {
      model: MODEL,
      canonical_model: MODEL,
      total: n,
      chunks: batchChunks(lines, chunkSize),
      validation: { invalid: 0, examples: [] },
    });
    return { doc, lines };
  };
  /** Starts the batch's workflow as the API does. */
  const start = (doc: BatchDoc) =>
    client.workflow.start(
      batchWorkflow,
      batchWorkflowStart(doc, MODEL, {
        taskQueue: gw.config.temporal.taskQueue,
        window: 2,
        heartbeatTimeoutMs: gw.config.batches.heartbeatTimeoutMs,
        createdWithinMs: gw.config.batches.createdWithinMs,
        webhook: null,
      }),
    );
  const inputsOf = (id: string) =>
    gw.store.db.collection('batch_inputs').countDocuments({ _id: { $gte: `${id}:`, $lt: `${id}:~` } } as never);
  const listed = async () => (await call(`${gw.url}/api/v1/batches?limit=100`, { key: t.inferenceKey })).body.data.map((b: any) => b.id);

  type Start = typeof WorkflowClient.prototype.start;
  /** A create of `n` lines whose workflow start is `instead` (given the real one), as a server that fails some way. */
  async function createWithStart(n: number, instead: (real: () => ReturnType<Start>, workflowId: string) => ReturnType<Start>) {
    const start = WorkflowClient.prototype.start;
    WorkflowClient.prototype.start = function (this: WorkflowClient, ...args: Parameters<Start>) {
      WorkflowClient.prototype.start = start;
      return instead(() => start.apply(this, args), args[1].workflowId);
    } as Start;
    try {
      return await call(`${gw.url}/api/v1/batches`, {
        key: t.inferenceKey,
        body: {
          endpoint: '/v1/chat/completions',
          model: MODEL,
          requests: Array.from({ length: n }, (_, i) => ({ custom_id: `l${i}`, body: JSON.parse(line(i).body) })),
        },
      });
    } finally {
      WorkflowClient.prototype.start = start;
    }
  }

  /** A batch of `n` lines created through the API, custom_ids `<tag><i>`. */
  const createLines = (n: number, tag: string, model = SLOW, callback_url?: string) =>
    call(`${gw.url}/api/v1/batches`, {
      key: t.inferenceKey,
      body: {
        endpoint: '/v1/chat/completions',
        model,
        requests: Array.from({ length: n }, (_, i) => ({ custom_id: `${tag}${i}`, body: JSON.parse(line(i).body) })),
        ...(callback_url && { callback_url }),
      },
    });
  /** Waits until at least `n` lines of a batch are done. */
  async function untilCompleted(id: string, n: number) {
    for (let i = 0; i < 200; i++) {
      if ((await call(`${gw.url}/api/v1/batches/${id}`, { key: t.inferenceKey })).body.request_counts.completed >= n) return;
      await new Promise((res) => setTimeout(res, 25));
    }
    throw new Error(`batch ${id} did not get ${n} line(s) done`);
  }

  it('runs a batch whose lines and document are stored a moment after its workflow started (chunks that looked before read again)', async () => {
    const { doc, lines } = newBatch(9, 3);
    const before = await providerCalls();
    const handle = await start(doc);
    await new Promise((r) => setTimeout(r, 300));
    const stored = await storeBatchLines(gw.store, doc, lines, 3);
    await publishBatch(gw.store, stored);
    expect(await handle.result()).to.equal('completed');
    // Each chunk ran in its first attempt: one that read no lines before they came read again,
    // rather than failing and waiting for Temporal's retry.
    const { events } = await handle.fetchHistory();
    const attempts = (events ?? []).flatMap((e) => e.activityTaskStartedEventAttributes?.attempt ?? []);
    expect(attempts).to.have.length(4); // three chunks and the close
    expect(attempts.every((n) => n === 1)).to.equal(true);
    const b = await readBatch(gw.store, doc._id);
    expect(b?.status).to.equal('completed');
    expect(b?.final_counts).to.deep.equal({ completed: 9, failed: 0 });
    expect(await providerCalls()).to.equal(before + 9);
    expect(await storedUsage(gw.store, { batch_id: doc._id })).to.have.length(9);
  });

  for (const [size, chunkSize] of [
    [1, 3],
    [9, 3],
  ]) {
    it(`gives up a batch whose document never comes: its lines are dropped, nothing runs, and a late store is refused (${size} line(s) in chunks of ${chunkSize})`, async () => {
      const { doc, lines } = newBatch(size, chunkSize);
      const before = await providerCalls();
      // As an API process that died between storing the lines and the document.
      const stored = await storeBatchLines(gw.store, doc, lines, chunkSize);
      expect(await inputsOf(doc._id)).to.be.above(0);
      const handle = await start(doc);
      expect(await handle.result()).to.equal('not_created');
      expect((await handle.describe()).typedSearchAttributes.get(searchAttributes.batchStatus)).to.equal('not_created');
      expect(await inputsOf(doc._id)).to.equal(0);
      expect(await listed()).to.not.include(doc._id);
      let refused: unknown = null;
      await publishBatch(gw.store, stored).catch((err) => (refused = err));
      expect(refused).to.be.instanceOf(BatchAbandonedError);
      expect(await readBatch(gw.store, doc._id)).to.equal(null);
      expect((await call(`${gw.url}/api/v1/batches/${doc._id}`, { key: t.inferenceKey })).status).to.equal(404);
      expect(await providerCalls()).to.equal(before);
      expect(await storedUsage(gw.store, { batch_id: doc._id })).to.have.length(0);
    });
  }

  it('a workflow whose batch the API gave up (its start seemed to fail) ends at once and runs nothing', async () => {
    const { doc } = newBatch(3, 3);
    const before = await providerCalls();
    expect(await abandonBatch(gw.store, doc._id)).to.equal(null);
    const began = Date.now();
    expect(await (await start(doc)).result()).to.equal('not_created');
    expect(Date.now() - began).to.be.below(1_500); // it did not wait for the document
    expect(await providerCalls()).to.equal(before);
    expect(await listed()).to.not.include(doc._id);
  });

  it('giving up a batch that was stored meanwhile keeps it: it runs', async () => {
    const { doc, lines } = newBatch(2, 3);
    const stored = await storeBatchLines(gw.store, doc, lines, 3);
    await publishBatch(gw.store, stored);
    expect((await abandonBatch(gw.store, doc._id))?._id).to.equal(doc._id);
    expect(await (await start(doc)).result()).to.equal('completed');
  });

  it("stores a new batch's lines while its workflow starts, not after: a create waits for the slower of the two, not for both", async () => {
    let storedDuringStart = 0;
    // The start goes ahead only once the lines are stored: a create that stored them after the
    // start would wait here until the start gave up (a 503).
    const r = await createWithStart(3, async (real, id) => {
      storedDuringStart = await until('the lines stored', async () => (await inputsOf(id)) || false, 5_000, 10);
      return real();
    });
    expect(r.status, JSON.stringify(r.body)).to.equal(202);
    expect(storedDuringStart).to.equal(1);
    const done = await waitForStatus(gw.url, t.inferenceKey, r.body.id, ['completed', 'failed'], 30_000);
    expect(done.request_counts).to.include({ total: 3, completed: 3 });
  });

  it('a create whose start reached Temporal but whose answer was lost is a 503, and the started workflow runs nothing (before: it ran and billed every line of a batch marked failed)', async () => {
    const before = await providerCalls();
    const cut = new Date();
    // The server takes the start; its answer never reaches the API (a slow server, a dropped connection).
    let started: string | null = null;
    const r = await createWithStart(3, async (real) => {
      started = (await real()).workflowId;
      throw new Error('the answer was lost');
    });
    expect(r.status, JSON.stringify(r.body)).to.equal(503);
    expect(r.body.error.message).to.equal('The batch could not be started, and nothing of it was kept; try again');
    expect(started).to.not.equal(null);
    expect(await client.workflow.getHandle(started!).result()).to.equal('not_created');
    expect(await providerCalls()).to.equal(before);
    expect(await storedUsage(gw.store, { batch_id: started! })).to.have.length(0);
    expect(await listed()).to.not.include(started);
    // Its lines, stored while the start was under way, are dropped before the answer.
    expect(await inputsOf(started!)).to.equal(0);
    expect(
      await gw.store.db.collection('batches').countDocuments({ _id: started!, abandoned: true, abandoned_at: { $gte: cut } } as never),
    ).to.equal(1);
  });

  it("a create whose store fails after its workflow started (the database's disk full) keeps that error, gives the batch up and drops its lines at once: its workflow runs nothing", async () => {
    const before = await providerCalls();
    // The insert that makes the batch visible is refused, as FerretDB refuses one with its disk full.
    const insertOne = Collection.prototype.insertOne;
    Collection.prototype.insertOne = function (this: Collection, doc: any, ...rest: any[]) {
      if (this.collectionName !== 'batches' || doc.abandoned) return insertOne.call(this, doc, ...rest);
      Collection.prototype.insertOne = insertOne;
      return Promise.reject(new MongoServerError({ message: '[msg_insert.go:168] [db.go:167] database or disk is full (13)', code: 1 }));
    } as typeof insertOne;
    let started: string | null = null;
    let r: Awaited<ReturnType<typeof createWithStart>>;
    try {
      r = await createWithStart(3, async (real) => {
        const handle = await real();
        started = handle.workflowId;
        return handle;
      });
    } finally {
      Collection.prototype.insertOne = insertOne;
    }
    expect(r.status, JSON.stringify(r.body)).to.equal(503);
    expect(r.body.error.message).to.equal('The database cannot store anything more right now (its disk is full); try again later');
    // Given up and dropped by the API itself, not by its workflow's wait (1.5 s here).
    expect(await readNewBatch(gw.store, started!)).to.equal('abandoned');
    expect(await inputsOf(started!)).to.equal(0);
    expect(await client.workflow.getHandle(started!).result()).to.equal('not_created');
    expect(await providerCalls()).to.equal(before);
    expect(await listed()).to.not.include(started);
  });

  it('a create whose start Temporal does not answer in time is a 503 that leaves nothing, and a start that lands later runs nothing', async () => {
    const before = await providerCalls();
    // A frozen server: the start answers only after the create has given up on it.
    let landed: Promise<string> | null = null;
    const began = Date.now();
    const r = await createWithStart(1, (real) => {
      const late = new Promise((res) => setTimeout(res, 2_500)).then(real);
      landed = late.then((h) => h.workflowId);
      return late;
    });
    expect(r.status, JSON.stringify(r.body)).to.equal(503);
    expect(r.body.error.message).to.equal('The batch could not be started, and nothing of it was kept; try again');
    expect(Date.now() - began).to.be.within(2_000, 10_000); // its bound, not the client's 30 s
    const id = await landed!;
    expect(await inputsOf(id)).to.equal(0);
    expect(await client.workflow.getHandle(id).result()).to.equal('not_created');
    expect(await providerCalls()).to.equal(before);
    expect(await listed()).to.not.include(id);
  });

  it('a cancel Temporal does not answer in time is a 503, not a wait of 30 s; the signal landing later cancels the batch', async () => {
    const r = await createLines(30, 's');
    expect(r.status, JSON.stringify(r.body)).to.equal(202);
    // A frozen server: the cancel's signal lands only after the API has given up on it.
    const getHandle = WorkflowClient.prototype.getHandle;
    WorkflowClient.prototype.getHandle = function (this: WorkflowClient, ...args: Parameters<typeof getHandle>) {
      WorkflowClient.prototype.getHandle = getHandle;
      const handle = getHandle.apply(this, args);
      const signal = handle.signal.bind(handle);
      return {
        ...handle,
        signal: (...a: Parameters<typeof signal>) => new Promise((res) => setTimeout(res, 2_500)).then(() => signal(...a)),
      };
    } as typeof getHandle;
    const began = Date.now();
    try {
      const cancel = await call(`${gw.url}/api/v1/batches/${r.body.id}/cancel`, { method: 'POST', key: t.inferenceKey });
      expect(cancel.status, JSON.stringify(cancel.body)).to.equal(503);
      expect(cancel.body.error.message).to.equal('The orchestration service is unavailable; try again');
    } finally {
      WorkflowClient.prototype.getHandle = getHandle;
    }
    expect(Date.now() - began).to.be.within(2_000, 10_000); // its bound, not the client's 30 s
    const done = await client.workflow.getHandle(r.body.id).result();
    expect(done).to.equal('cancelled');
    const b = await call(`${gw.url}/api/v1/batches/${r.body.id}`, { key: t.inferenceKey });
    expect(b.body.status).to.equal('cancelled');
    expect(b.body.request_counts.completed).to.be.below(30);
  });

  it('a batch whose workflow was terminated (an operator, a bug) is closed by its cancel: a 200, every line has a result, completed lines billed once (before: a 500, and in_progress for good)', async () => {
    const r = await createLines(20, 'z');
    expect(r.status, JSON.stringify(r.body)).to.equal(202);
    await untilCompleted(r.body.id, 1);
    await client.workflow.getHandle(r.body.id).terminate('an operator');
    const cancel = await call(`${gw.url}/api/v1/batches/${r.body.id}/cancel`, { method: 'POST', key: t.inferenceKey });
    expect(cancel.status, JSON.stringify(cancel.body)).to.equal(200);
    expect(cancel.body.status).to.equal('cancelling');
    const b = await waitForStatus(gw.url, t.inferenceKey, r.body.id, ['cancelled', 'failed', 'completed'], 30_000);
    expect(b.status).to.equal('cancelled');
    expect(b.results).to.have.length(20);
    const completed = b.results.filter((x: any) => x.response).length;
    expect(completed).to.be.within(1, 19);
    expect(b.request_counts).to.deep.include({ total: 20, completed, failed: 20 - completed });
    expect(b.results.filter((x: any) => x.error?.type === 'batch_cancelled')).to.have.length(20 - completed);
    expect(await storedUsage(gw.store, { batch_id: r.body.id })).to.have.length(completed);
    // A second cancel of the closed batch: the usual conflict, no second run.
    expect((await call(`${gw.url}/api/v1/batches/${r.body.id}/cancel`, { method: 'POST', key: t.inferenceKey })).status).to.equal(409);
  });

  for (const status of ['in_progress', 'cancelling'] as const) {
    it(`a batch stored ${status} whose workflow Temporal does not have (its state lost) is closed by its cancel: a 200, and every line cancelled`, async () => {
      const { doc, lines } = newBatch(5, 2);
      // Stored as a Temporal that lost its state left it; its model named by a routing shortcut.
      await createBatch(gw.store, { ...doc, status, model: `${MODEL}:nitro` }, lines, 2);
      const cancel = await call(`${gw.url}/api/v1/batches/${doc._id}/cancel`, { method: 'POST', key: t.inferenceKey });
      expect(cancel.status, JSON.stringify(cancel.body)).to.equal(200);
      const b = await waitForStatus(gw.url, t.inferenceKey, doc._id, ['cancelled', 'failed', 'completed'], 30_000);
      expect(b.status).to.equal('cancelled');
      expect(b.request_counts).to.deep.include({ total: 5, completed: 0, failed: 5 });
      expect(b.results.map((x: any) => x.error?.type)).to.deep.equal(Array(5).fill('batch_cancelled'));
      // The new run is listed under the catalog's id, as a first run is.
      expect((await client.workflow.getHandle(doc._id).describe()).typedSearchAttributes.get(searchAttributes.model)).to.equal(MODEL);
    });
  }

  it('cancels of a running batch, repeated as a client in a loop would, start no second run', async () => {
    const r = await createLines(20, 'y');
    expect(r.status, JSON.stringify(r.body)).to.equal(202);
    const first = await client.workflow.getHandle(r.body.id).describe();
    for (let i = 0; i < 3; i++)
      expect((await call(`${gw.url}/api/v1/batches/${r.body.id}/cancel`, { method: 'POST', key: t.inferenceKey })).status).to.be.oneOf([
        200, 409,
      ]);
    expect((await waitForStatus(gw.url, t.inferenceKey, r.body.id, ['cancelled', 'failed', 'completed'], 30_000)).status).to.equal(
      'cancelled',
    );
    const runs = [];
    for await (const w of client.workflow.list({ query: `WorkflowId = '${r.body.id}'` })) runs.push(w.runId);
    expect(runs).to.deep.equal([first.runId]);
  });

  it('`gateway recover-batches` gives every open batch whose run is gone a new run, which finishes it without running a finished line again; one whose run an operator terminated is closed cancelled; a running batch is left alone', async () => {
    const slowCalls = await providerCalls('creationslow=1');
    // One whose run is gone half way (a Temporal that lost its state after it started).
    const cut = await createLines(12, 'c');
    expect(cut.status, JSON.stringify(cut.body)).to.equal(202);
    await untilCompleted(cut.body.id, 2);
    await client.workflowService.deleteWorkflowExecution({
      namespace: gw.config.temporal.namespace,
      workflowExecution: { workflowId: cut.body.id },
    });
    await until(
      'the deleted workflow gone',
      async () =>
        (await client.workflow
          .getHandle(cut.body.id)
          .describe()
          .catch((err) => err)) instanceof WorkflowNotFoundError,
      10_000,
      100,
    );
    // One an operator stopped: it is not run on.
    const stopped = await createLines(12, 's', STOPPED);
    expect(stopped.status, JSON.stringify(stopped.body)).to.equal(202);
    await untilCompleted(stopped.body.id, 1);
    await client.workflow.getHandle(stopped.body.id).terminate('an operator');
    // One Temporal never had, in two chunks.
    const { doc, lines } = newBatch(5, 3);
    await createBatch(gw.store, doc, lines, 3);
    // One that runs (for a minute).
    const running = await createLines(60, 'r', LONG);
    expect(running.status, JSON.stringify(running.body)).to.equal(202);
    const runningRun = (await client.workflow.getHandle(running.body.id).describe()).runId;

    const env = {
      ...process.env,
      LOG_LEVEL: 'warn',
      MONGODB_URI: stack.mongoUri,
      MONGODB_DATABASE: gw.config.mongo.database,
      TEMPORAL_ADDRESS: stack.temporalAddress,
      TEMPORAL_TASK_QUEUE: gw.config.temporal.taskQueue,
      BATCH_HEARTBEAT_TIMEOUT_MS: String(gw.config.batches.heartbeatTimeoutMs),
    };
    const cli = spawn(
      process.execPath,
      [path.join(__dirname, '..', 'cli', 'index.js'), 'recover-batches', '--json', '--workspace', t.workspaceId],
      { env },
    );
    let out = '';
    let err = '';
    cli.stdout.on('data', (d) => (out += d));
    cli.stderr.on('data', (d) => (err += d));
    expect(await new Promise((r) => cli.on('exit', r)), err).to.equal(0);
    const r = JSON.parse(out);
    expect(r.started).to.have.members([cut.body.id, doc._id]);
    expect(r.ended).to.deep.equal([]);
    expect(r.cancelled).to.deep.equal([stopped.body.id]);
    const closed = await waitForStatus(gw.url, t.inferenceKey, stopped.body.id, ['completed', 'failed', 'cancelled', 'expired'], 30_000);
    expect(closed.status).to.equal('cancelled');
    expect(closed.results).to.have.length(12);
    expect(closed.request_counts.completed).to.be.within(1, 6);
    expect(await storedUsage(gw.store, { batch_id: stopped.body.id })).to.have.length(closed.request_counts.completed);
    // Nothing of it was run after the operator stopped it: at most the line then in flight.
    expect(await providerCalls('creationstopped=1')).to.be.within(closed.request_counts.completed, closed.request_counts.completed + 1);
    expect(r.running).to.be.at.least(1); // this one, and any other of the workspace still running
    // Left alone: the same run goes on (then cancelled: the test does not wait for its minute).
    expect((await client.workflow.getHandle(running.body.id).describe()).runId).to.equal(runningRun);
    expect((await call(`${gw.url}/api/v1/batches/${running.body.id}/cancel`, { method: 'POST', key: t.inferenceKey })).status).to.equal(
      200,
    );

    for (const [id, n] of [
      [cut.body.id, 12],
      [doc._id, 5],
    ] as const) {
      const b = await waitForStatus(gw.url, t.inferenceKey, id, ['completed', 'failed', 'cancelled', 'expired'], 30_000);
      expect(b.status, id).to.equal('completed');
      expect(b.request_counts).to.deep.include({ total: n, completed: n, failed: 0 });
      expect(new Set(b.results.map((x: any) => x.custom_id)).size).to.equal(n);
      // Billed once a line: the lines finished before the run was cut were not run again.
      expect(await storedUsage(gw.store, { batch_id: id })).to.have.length(n);
    }
    // Each line called once, but for the one the cut run had in flight.
    expect((await providerCalls('creationslow=1')) - slowCalls).to.be.within(12, 13);
  });

  it("batches whose runs an operator terminated or cancelled in Temporal are closed cancelled by a worker's next look: every line has a result, the finished ones billed once, nothing run after, the closing run's webhook left to it (before: in_progress for good)", async () => {
    const watching = await startTestGateway({
      env: {
        CATALOG_PATH: gw.config.catalogPath,
        MONGODB_DATABASE: gw.config.mongo.database,
        BATCH_STOPPED_RUNS_EVERY_MS: '300',
        BATCH_HEARTBEAT_TIMEOUT_MS: String(gw.config.batches.heartbeatTimeoutMs),
        WEBHOOKS_ALLOW_PRIVATE_URLS: 'true',
      },
    });
    const stoppedCalls = await providerCalls('creationstopped=1');
    // A receiver that refuses every delivery: the closing run keeps retrying its webhook.
    const refusing = http.createServer((_req, res) => res.writeHead(500).end());
    await new Promise<void>((r) => refusing.listen(0, '127.0.0.1', r));
    const callback = `http://127.0.0.1:${(refusing.address() as AddressInfo).port}/hook`;
    try {
      const terminated = await createLines(20, 'tt', SLOW, callback);
      const cancelled = await createLines(20, 'tc', STOPPED);
      expect([terminated.status, cancelled.status], JSON.stringify([terminated.body, cancelled.body])).to.deep.equal([202, 202]);
      await untilCompleted(terminated.body.id, 1);
      await untilCompleted(cancelled.body.id, 1);
      const stoppedRuns = [
        (await client.workflow.getHandle(terminated.body.id).describe()).runId,
        (await client.workflow.getHandle(cancelled.body.id).describe()).runId,
      ];
      await client.workflow.getHandle(terminated.body.id).terminate('an operator');
      await client.workflow.getHandle(cancelled.body.id).cancel();
      for (const id of [terminated.body.id, cancelled.body.id]) {
        const b = await waitForStatus(gw.url, t.inferenceKey, id, ['completed', 'failed', 'cancelled', 'expired'], 30_000);
        expect(b.status, id).to.equal('cancelled');
        expect(b.results).to.have.length(20);
        const completed = b.results.filter((x: any) => x.response).length;
        expect(completed).to.be.within(1, 19);
        expect(b.request_counts).to.deep.include({ total: 20, completed, failed: 20 - completed });
        expect(b.results.filter((x: any) => x.error?.type === 'batch_cancelled')).to.have.length(20 - completed);
        expect(await storedUsage(gw.store, { batch_id: id })).to.have.length(completed);
        // Closed by a new run, the watching worker's.
        expect((await client.workflow.getHandle(id).describe()).runId).to.not.be.oneOf(stoppedRuns);
        if (id === cancelled.body.id) {
          // Every line its provider was called for is billed, but the one in flight when the
          // stopped run's chunk learned it was stopped: the close waited for that chunk.
          expect((await providerCalls('creationstopped=1')) - stoppedCalls).to.be.within(completed, completed + 1);
        }
      }
      expect(await client.workflow.getHandle(cancelled.body.id).result()).to.equal('cancelled');
      // The closing run retries its webhook meanwhile: later looks, which still see the stopped
      // run, leave its delivery to it rather than record it as stopped.
      const closing = client.workflow.getHandle(terminated.body.id);
      await new Promise((r) => setTimeout(r, 1_000));
      expect((await closing.describe()).status.name).to.equal('RUNNING');
      expect((await call(`${gw.url}/api/v1/batches/${terminated.body.id}`, { key: t.inferenceKey })).body.webhook).to.equal(null);
      await closing.terminate('the test is over');
    } finally {
      await watching.stop();
      refusing.close();
    }
  });

  it("a worker that starts on a Temporal whose namespace has a new id (its state lost) gives its database's open batches new runs, once; a database that has recorded no id only records it", async () => {
    const database = `recovery_${Date.now()}`;
    const prepared = await Store.connect(stack.mongoUri, database);
    const { namespaceInfo } = await client.workflowService.describeNamespace({ namespace: gw.config.temporal.namespace });
    const current = `${gw.config.temporal.namespace}:${namespaceInfo!.id}`;
    const states = () => prepared.db.collection('temporal_states').find({}).toArray();
    const started: TestGateway[] = [];
    const start = async () => {
      const { logger, lines } = capturingLogger();
      started.push(
        await startTestGateway({
          env: { CATALOG_PATH: gw.config.catalogPath, MONGODB_DATABASE: database, BATCH_HEARTBEAT_TIMEOUT_MS: '2000' },
          logger,
        }),
      );
      return { gateway: started[started.length - 1], said: () => lines.map((l) => String(l.msg)) };
    };
    try {
      // A database of an earlier version: no id recorded. Its first start records one and recovers nothing.
      const tenant = await createTenant(prepared, 5);
      const before = newBatch(3, 2);
      before.doc.workspace_id = tenant.workspaceId;
      await createBatch(prepared, before.doc, before.lines, 2); // open, and its run gone with Temporal's state
      const first = await start();
      await until('one namespace state recorded', async () => (await states()).length === 1, 10_000, 100);
      expect((await states()).map((d) => d._id)).to.deep.equal([current]);
      await first.gateway.stop();
      started.pop();
      expect(first.said().join('\n')).to.not.include("Temporal's state is new");
      expect((await prepared.db.collection('batches').findOne({ _id: before.doc._id } as never))?.status).to.equal('in_progress');

      // As if Temporal had been reset since: the database last ran batches on another id.
      await prepared.db.collection('temporal_states').deleteMany({});
      await prepared.db
        .collection('temporal_states')
        .insertOne({ _id: `${gw.config.temporal.namespace}:an-earlier-id`, seen_at: new Date() } as never);
      // A worker stopped before its recovery finished records nothing: the next start does it again.
      await recoverIfTemporalIsNew(
        prepared,
        client,
        new BatchRuns(client, first.gateway.config, Catalog.fromFile(gw.config.catalogPath, gw.config.catalogEnv)),
        first.gateway.config,
        capturingLogger().logger,
        AbortSignal.abort(),
      );
      expect((await states()).map((d) => d._id)).to.deep.equal([`${gw.config.temporal.namespace}:an-earlier-id`]);
      expect(
        await client.workflow
          .getHandle(before.doc._id)
          .describe()
          .catch((err) => err.name),
      ).to.equal('WorkflowNotFoundError');
      const second = await start();
      const b = await waitForStatus(
        second.gateway.url,
        tenant.inferenceKey,
        before.doc._id,
        ['completed', 'failed', 'cancelled', 'expired'],
        30_000,
      );
      expect(b.status).to.equal('completed');
      expect(b.request_counts).to.deep.include({ total: 3, completed: 3, failed: 0 });
      await until('the recovery logged', () => second.said().some((l) => l.includes("Temporal's state is new")), 10_000, 100);
      expect(second.said()).to.include(
        `Temporal's state is new (namespace ${gw.config.temporal.namespace} has a new id): 1 open batch(es) from before given a new run`,
      );
      expect((await states()).map((d) => d._id).sort()).to.deep.equal([`${gw.config.temporal.namespace}:an-earlier-id`, current].sort());

      // The next start on the same state recovers nothing: its check, awaited to its end.
      const third = capturingLogger();
      await recoverIfTemporalIsNew(
        prepared,
        client,
        new BatchRuns(client, second.gateway.config, Catalog.fromFile(gw.config.catalogPath, gw.config.catalogEnv)),
        second.gateway.config,
        third.logger,
        new AbortController().signal,
      );
      expect(third.lines.map((l) => String(l.msg)).join('\n')).to.not.include("Temporal's state is new");
      expect((await states()).map((d) => d._id).sort()).to.deep.equal([`${gw.config.temporal.namespace}:an-earlier-id`, current].sort());
    } finally {
      for (const g of started) await g.stop();
      await prepared.db.dropDatabase();
      await prepared.close();
    }
  });

  it('a create whose workflow cannot be started is a 503 that leaves nothing: no batch listed, no line stored, its id given up', async () => {
    const cut = new Date();
    // A namespace the server does not have: every start fails.
    const broken = await startTestGateway({
      withWorker: false,
      env: { CATALOG_PATH: gw.config.catalogPath, MONGODB_DATABASE: gw.config.mongo.database, TEMPORAL_NAMESPACE: 'no-such-namespace' },
    });
    try {
      const r = await call(`${broken.url}/api/v1/batches`, {
        key: t.inferenceKey,
        body: { endpoint: '/v1/chat/completions', model: MODEL, requests: [{ custom_id: 'a', body: JSON.parse(line(0).body) }] },
      });
      expect(r.status, JSON.stringify(r.body)).to.equal(503);
      expect(r.body.error.message).to.equal('The batch could not be started, and nothing of it was kept; try again');
      const given = await gw.store.db
        .collection('batches')
        .find({ abandoned: true, abandoned_at: { $gte: cut } })
        .toArray();
      expect(given).to.have.length(1);
      const id = String(given[0]._id);
      expect(await inputsOf(id)).to.equal(0);
      expect(await listed()).to.not.include(id);
      expect((await call(`${gw.url}/api/v1/batches/${id}`, { key: t.inferenceKey })).status).to.equal(404);
    } finally {
      await broken.stop();
    }
  });
});
