// Proves the wiring end to end: client ▶ Temporal server ▶ worker ▶ activity ▶ MongoDB and back;
// and that the worker runs its activities in no AsyncLocalStorage.
import { expect } from 'chai';
import { Worker } from '@temporalio/worker';
import { Store } from '../infrastructure/store';
import { connectTemporal, type TemporalHandles } from '../infrastructure/temporal/client';
import { createWorker } from '../worker';
import { runSelfCheck } from '../cli';
import { createLogger } from '../infrastructure/log';
import { stack } from './fixture';
import { createUpstreams } from '../domain/routing/upstreams';
import { loadConfig } from '../infrastructure/config';
import { call, createTenant, startTestGateway, testActivities, uniqueName, waitForStatus } from './helpers';
import { questions, state } from './decision-sample';
import { storagesEntered } from './storages-entered';

describe('Temporal + MongoDB wiring', () => {
  let store: Store;
  let temporal: TemporalHandles;

  before(async () => {
    store = await Store.connect(stack.mongoUri, uniqueName('wiring').replace(/-/g, '_'));
    temporal = await connectTemporal(stack.temporalAddress, stack.namespace, createLogger('silent'));
  });
  after(async () => {
    await temporal.connection.close();
    await store.close();
  });

  it('runs a workflow whose activity writes to and reads from MongoDB', async () => {
    const taskQueue = uniqueName('wiring');
    const config = loadConfig({ SANDBOX_URL: stack.sandboxUrl });
    const upstreams = createUpstreams(config, store);
    const worker: Worker = await createWorker({
      connection: temporal.connection,
      namespace: stack.namespace,
      taskQueue,
      activities: testActivities(store, upstreams, config),
    });
    const result = await worker.runUntil(runSelfCheck(temporal.client, taskQueue));
    expect(result.note).to.match(/^checked at /);
    // The document really is in the database, under the workflow's id.
    const doc = await store.probes.findOne({ _id: result.id });
    expect(doc).to.include({ _id: result.id, note: result.note });
    const history = await temporal.client.workflow.getHandle(result.id).fetchHistory();
    const activities = (history.events ?? []).filter((e) => e.activityTaskCompletedEventAttributes);
    expect(activities).to.have.length(2);
    await upstreams.close();
  });

  it("runs batch chunks and workflow-mode decisions in no AsyncLocalStorage (the first would turn on Node's promise hooks for every later promise of the process)", async function () {
    this.timeout(60_000);
    const gw = await startTestGateway({ env: { DECISIONS_EXECUTION: 'workflow' } });
    const t = await createTenant(gw.store, 5);
    let entered: string[];
    try {
      entered = await storagesEntered(async () => {
        // A chunk reads its heartbeat and cancellation from its activity context, a decision its cancellation.
        const requests = [1, 2, 3].map((i) => ({ custom_id: `r${i}`, body: { messages: [{ role: 'user', content: `line ${i}` }] } }));
        const created = await call(`${gw.url}/api/v1/batches`, {
          key: t.inferenceKey,
          body: { endpoint: '/v1/chat/completions', model: 'sandbox/chat-1', requests },
        });
        expect(created.status).to.equal(202);
        const done = await waitForStatus(gw.url, t.inferenceKey, created.body.id, ['completed', 'failed', 'expired', 'cancelled']);
        expect(done.status).to.equal('completed');
        expect(done.request_counts).to.deep.equal({ total: 3, completed: 3, failed: 0 });
        const decided = await call(`${gw.url}/api/v1/systemone`, { key: t.inferenceKey, body: { model: 'jev-1.13', state, questions } });
        expect(decided.status).to.equal(200);
      });
    } finally {
      await gw.stop();
    }
    expect(entered).to.deep.equal([]);
  });
});
