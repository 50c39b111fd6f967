// The in-process hand-off of decision results (infrastructure/temporal/decision-handoff): a decision run by this
// process's worker answers from its activity, without asking the server; failures, runs on another
// worker and runs whose activity reports to another process fall back to the server's answer.
import { expect } from 'chai';
import { WorkflowFailedError, type WorkflowHandle } from '@temporalio/client';
import type { Worker } from '@temporalio/worker';
import { Store } from '../infrastructure/store';
import { connectTemporal, type TemporalHandles } from '../infrastructure/temporal/client';
import { DecisionHandoff } from '../infrastructure/temporal/decision-handoff';
import { createWorker } from '../worker';
import { createUpstreams } from '../domain/routing/upstreams';
import { loadConfig } from '../infrastructure/config';
import { createLogger } from '../infrastructure/log';
import type { DecisionJob } from '../activities';
import { decisionWorkflow } from '../workflows/decision';
import { stack } from './fixture';
import { testActivities, uniqueName } from './helpers';

const request = {
  model: 'jev-1.13',
  state: 'The parcel arrived broken',
  questions: { refund: { type: 'noul' as const, instructions: 'Should we refund?' } },
};

describe('decision hand-off from the in-process worker', () => {
  let store: Store;
  let upstreams: ReturnType<typeof createUpstreams>;
  let temporal: TemporalHandles;
  let worker: Worker;
  let running: Promise<void>;
  const taskQueue = uniqueName('handoff');
  // The handoff the worker's activities report to: this process's.
  const local = new DecisionHandoff(60_000);

  before(async () => {
    store = await Store.connect(stack.mongoUri, uniqueName('handoff').replace(/-/g, '_'));
    const config = loadConfig({ SANDBOX_URL: stack.sandboxUrl });
    upstreams = createUpstreams(config, store);
    temporal = await connectTemporal(stack.temporalAddress, stack.namespace, createLogger('silent'));
    worker = await createWorker({
      connection: temporal.connection,
      namespace: stack.namespace,
      taskQueue,
      activities: testActivities(store, upstreams, config, local),
    });
    running = worker.run();
  });
  after(async () => {
    worker.shutdown();
    await running;
    await temporal.connection.close();
    await upstreams.close();
    await store.close();
  });

  /** Starts a decision on `client`, counting how often the caller asked the server for its result. */
  function starter(client = temporal.client, over: Partial<DecisionJob['request']> = {}) {
    const generationId = `gen-dec-${uniqueName('t')}`;
    const asked = { server: 0 };
    const start = async () => {
      const handle = await client.workflow.start(decisionWorkflow, {
        workflowId: generationId,
        taskQueue,
        requestEagerStart: true,
        args: [
          {
            generationId,
            workspaceId: 'ws-handoff',
            keyId: 'key-handoff',
            request: { ...request, ...over },
            meta: { session_id: null, user: null, trace: null, app: { referer: null, title: null, categories: [] } },
            workspace: {},
          } as DecisionJob,
        ],
      });
      const result = handle.result.bind(handle);
      return Object.assign(handle, {
        result: () => {
          asked.server++;
          return result();
        },
      }) as WorkflowHandle & { eagerlyStarted: boolean };
    };
    return { generationId, asked, start };
  }

  it('answers from the activity of an eagerly started run, without asking the server', async () => {
    const { generationId, asked, start } = starter();
    const result = await local.execute(generationId, start);
    expect(result.id).to.equal(generationId);
    expect(result.answers.refund).to.have.property('noul').that.is.a('number');
    expect(asked.server).to.equal(0);
    expect(local.pending).to.equal(0);
    // The same answer the workflow completed with, as the server records it.
    expect(await temporal.client.workflow.getHandle(generationId).result()).to.deep.equal(result);
  });

  it('takes a failure from the server, with its details', async () => {
    const { generationId, asked, start } = starter(temporal.client, { model: 'nobody/no-such-model' });
    const err = await local.execute(generationId, start).then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).to.be.instanceOf(WorkflowFailedError);
    expect(String((err as WorkflowFailedError).cause?.message)).to.match(/no-such-model/);
    expect(asked.server).to.equal(1);
    expect(local.pending).to.equal(0);
  });

  it('asks the server when the run was not eagerly started on this process', async () => {
    // A client on a connection of its own cannot hand the first task to this worker.
    const other = await connectTemporal(stack.temporalAddress, stack.namespace, createLogger('silent'));
    try {
      const { generationId, asked, start } = starter(other.client);
      const result = await new DecisionHandoff(60_000).execute(generationId, start);
      expect(result.id).to.equal(generationId);
      expect(asked.server).to.equal(1);
    } finally {
      await other.connection.close();
    }
  });

  it('falls back to the server when the activity reports to another process', async () => {
    const elsewhere = new DecisionHandoff(300);
    const { generationId, asked, start } = starter();
    const t0 = Date.now();
    const result = await elsewhere.execute(generationId, start);
    expect(result.id).to.equal(generationId);
    expect(asked.server).to.equal(1);
    expect(Date.now() - t0).to.be.at.least(300);
    expect(elsewhere.pending).to.equal(0);
  });
});
