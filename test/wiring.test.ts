// Proves the wiring end to end: client ▶ Temporal server ▶ worker ▶ activity ▶ MongoDB and back.
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
import { testActivities, uniqueName } from './helpers';

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
});
