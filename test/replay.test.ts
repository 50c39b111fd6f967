// Workflow determinism: recorded histories of the batch and decision workflows (test/histories)
// replayed against today's workflow code, offline. A change to a workflow that would break runs
// already in flight fails here. Re-record after an intended, versioned change with
// RECORD_HISTORIES=1 npm test, keeping the previous recordings as <name>.<date>.history.pb: runs
// started by that version may still be in flight when a new one is deployed, and must replay too.
import { expect } from 'chai';
import fs from 'node:fs';
import path from 'node:path';
import { Client, Connection } from '@temporalio/client';
import { temporal } from '@temporalio/proto';
import { Worker } from '@temporalio/worker';
import { stack } from './fixture';
import { call, createTenant, startTestGateway, testBatchDoc, waitForStatus, type Tenant } from './helpers';
import { abandonBatch } from '../domain/batches/store';
import { batchWorkflow, batchWorkflowStart } from '../workflows/batch';

const DIR = path.resolve(__dirname, '..', '..', 'test', 'histories');

/** A 2-line batch's document, never stored. */
function givenUp(t: Tenant) {
  const doc = testBatchDoc(t, {
    model: 'sandbox/embed-1',
    endpoint: '/v1/embeddings',
    total: 2,
    chunks: 1,
    validation: { invalid: 0, examples: [] },
  });
  return { doc };
}

describe('workflow replay', () => {
  before(async function () {
    if (!process.env.RECORD_HISTORIES) return;
    this.timeout(120_000);
    // Runs on the real stack; each history is saved as JSON for the replay below.
    const gw = await startTestGateway({ env: { DECISIONS_EXECUTION: 'workflow', BATCH_CHUNK_SIZE: '3' } });
    const connection = await Connection.connect({ address: stack.temporalAddress });
    try {
      const t = await createTenant(gw.store, 10);
      const client = new Client({ connection });
      const save = async (name: string, workflowId: string) => {
        const { history } = await client.workflowService.getWorkflowExecutionHistory({
          namespace: stack.namespace,
          execution: { workflowId },
        });
        fs.mkdirSync(DIR, { recursive: true });
        // Saved in protobuf's binary form, exactly what the server sent.
        fs.writeFileSync(path.join(DIR, `${name}.history.pb`), temporal.api.history.v1.History.encode(history!).finish());
      };
      const lines = (n: number) => Array.from({ length: n }, (_, i) => ({ custom_id: `r${i}`, body: { input: `text ${i}` } }));
      const done = await call(`${gw.url}/api/v1/batches`, {
        key: t.inferenceKey,
        body: { endpoint: '/v1/embeddings', model: 'sandbox/embed-1', requests: lines(10) },
      });
      await waitForStatus(gw.url, t.inferenceKey, done.body.id, ['completed']);
      await save('batch-completed', done.body.id);
      const one = await call(`${gw.url}/api/v1/batches`, {
        key: t.inferenceKey,
        body: { endpoint: '/v1/embeddings', model: 'sandbox/embed-1', requests: lines(2) },
      });
      await waitForStatus(gw.url, t.inferenceKey, one.body.id, ['completed']);
      await save('batch-one-chunk', one.body.id);
      const cancelled = await call(`${gw.url}/api/v1/batches`, {
        key: t.inferenceKey,
        body: { endpoint: '/v1/embeddings', model: 'sandbox/embed-1', requests: lines(10) },
      });
      await call(`${gw.url}/api/v1/batches/${cancelled.body.id}/cancel`, { method: 'POST', key: t.inferenceKey });
      await waitForStatus(gw.url, t.inferenceKey, cancelled.body.id, ['cancelled']);
      await save('batch-cancelled', cancelled.body.id);
      const invalid = await call(`${gw.url}/api/v1/batches`, {
        key: t.inferenceKey,
        body: { endpoint: '/v1/embeddings', model: 'sandbox/embed-1', requests: [{ custom_id: 'x', body: { input: 7 } }] },
      });
      await waitForStatus(gw.url, t.inferenceKey, invalid.body.id, ['failed']);
      await save('batch-invalid', invalid.body.id);
      // A batch given up before it was stored: its workflow ends without running anything.
      const { doc } = givenUp(t);
      await abandonBatch(gw.store, doc._id);
      const handle = await client.workflow.start(
        batchWorkflow,
        batchWorkflowStart(doc, 'sandbox/embed-1', {
          taskQueue: gw.config.temporal.taskQueue,
          window: 2,
          heartbeatTimeoutMs: gw.config.batches.heartbeatTimeoutMs,
          createdWithinMs: gw.config.batches.createdWithinMs,
          webhook: null,
        }),
      );
      expect(await handle.result()).to.equal('not_created');
      await save('batch-not-created', doc._id);
      const decision = await call(`${gw.url}/api/v1/systemone`, {
        key: t.inferenceKey,
        body: { model: 'jev-1.13', state: 'x', questions: { q: { type: 'noul', instructions: 'ok?' } } },
      });
      expect(decision.status).to.equal(200);
      await client.workflow.getHandle(decision.body.id).result(); // answered before its completion is recorded
      await save('decision', decision.body.id);
    } finally {
      await connection.close();
      await gw.stop();
    }
  });

  it('every recorded history replays against the current workflow code', async function () {
    this.timeout(60_000);
    const files = fs
      .readdirSync(DIR)
      .filter((f) => f.endsWith('.history.pb'))
      .sort();
    expect(files).to.include.members([
      'batch-not-created.history.pb',
      'batch-completed.history.pb',
      'batch-one-chunk.history.pb',
      'batch-cancelled.history.pb',
      'batch-invalid.history.pb',
      'decision.history.pb',
    ]);
    const histories = files.map((f) => ({
      workflowId: f.replace(/\.history\.pb$/, ''),
      history: temporal.api.history.v1.History.decode(fs.readFileSync(path.join(DIR, f))),
    }));
    const failures: string[] = [];
    for await (const r of Worker.runReplayHistories(
      { workflowsPath: require.resolve('../workflows'), replayName: 'gateway-replay' },
      histories,
    )) {
      if (r.error) failures.push(`${r.workflowId}: ${r.error.message}`);
    }
    expect(failures).to.deep.equal([]);
  });

  it('fails on a changed workflow: replaying against a batch workflow with a new first step raises a determinism error', async function () {
    this.timeout(60_000);
    const history = temporal.api.history.v1.History.decode(fs.readFileSync(path.join(DIR, 'batch-completed.history.pb')));
    const result = await Worker.runReplayHistory(
      { workflowsPath: require.resolve('./replay-variant/workflows'), replayName: 'gateway-replay-changed' },
      history,
      'batch-completed',
    ).then(
      () => null,
      (err: Error) => err,
    );
    expect(result, 'the changed workflow replayed without error').to.be.instanceOf(Error);
    expect(result!.name).to.equal('DeterminismViolationError');
  });
});
