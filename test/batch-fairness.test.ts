// Workspaces take turns on the batch workers: each batch workflow carries its workspace as its
// Temporal fairness key (its activities inherit it), and the embedded Temporal server runs with
// fairness on. A backlog of one workspace's batches is then served in turn with another's, not
// first come, first served. Measured before: another workspace's 2,000-line batch took 8.6-14.5 s
// behind 600 one-line batches of one workspace, against 2.8-2.9 s with fairness.
import { expect } from 'chai';
import { call, createTenant, startTestGateway, waitForStatus, type TestGateway } from './helpers';

describe('batch fairness between workspaces', function () {
  this.timeout(120_000);
  let api: TestGateway | undefined;
  let worker: TestGateway | undefined;

  before(function () {
    // Fairness is the Temporal server's to apply: the embedded one has it on (devstack/services.ts).
    if (process.env.TEMPORAL_ADDRESS) this.skip();
  });

  after(async () => {
    await worker?.stop();
    await api?.stop();
  });

  it("one workspace's backlog of batches does not keep another's waiting behind it", async () => {
    // Batches are created with no worker polling, so that all of them wait in the queue at once.
    // A backlog of 200 batches of one workspace: past its create limit.
    api = await startTestGateway({ withWorker: false, env: { BATCH_CREATES_PER_MINUTE: '1000' } });
    const hog = await createTenant(api.store, 50);
    const other = await createTenant(api.store, 50);
    const create = async (key: string) => {
      const r = await call(`${api!.url}/api/v1/batches`, {
        key,
        body: { endpoint: '/v1/embeddings', model: 'sandbox/embed-1', requests: [{ custom_id: 'a', body: { input: 'x', dimensions: 2 } }] },
      });
      expect(r.status, JSON.stringify(r.body)).to.equal(202);
      return r.body.id as string;
    };
    const HOG_BATCHES = 200;
    const hogs: string[] = [];
    let asked = 0;
    await Promise.all(
      Array.from({ length: 8 }, async () => {
        while (asked++ < HOG_BATCHES) hogs.push(await create(hog.inferenceKey));
      }),
    );
    const last = await create(other.inferenceKey); // behind all of them in arrival order

    worker = await startTestGateway({
      withWorker: true,
      env: { MONGODB_DATABASE: api.config.mongo.database, TEMPORAL_TASK_QUEUE: api.config.temporal.taskQueue },
    });
    await waitForStatus(api.url, other.inferenceKey, last, ['completed'], 60_000);
    const hogsDone = await api.store.db.collection('batches').countDocuments({ _id: { $in: hogs as any[] }, status: 'completed' });
    // First come, first served finished it after all 200 (twice in two runs); with fairness, 0-34 were done (four runs).
    expect(hogsDone, `the hog's batches completed before the last one created`).to.be.below(HOG_BATCHES / 2);
    for (const id of hogs) await waitForStatus(api.url, hog.inferenceKey, id, ['completed'], 60_000);
  });
});
