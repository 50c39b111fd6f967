// A workspace's downloads of batch results (RESULT_BYTES_PER_MINUTE): a download admitted runs to
// its end and is counted as it is sent; once the window is spent the next is refused before anything
// is read; a batch read without its results, and another workspace, are not touched.
import { expect } from 'chai';
import { call, clearOfWindowEdge, createTenant, startTestGateway, type Tenant, type TestGateway } from './helpers';

describe('result downloads per workspace', () => {
  let gw: TestGateway;
  let a: Tenant;
  let b: Tenant;
  before(async () => {
    gw = await startTestGateway({ env: { RESULT_BYTES_PER_MINUTE: '128kb' } });
    [a, b] = [await createTenant(gw.store), await createTenant(gw.store)];
  });
  after(async () => gw.stop());

  /** A finished batch of `lines` chat lines, polled without its results. */
  async function finishedBatch(key: string, lines: number): Promise<string> {
    const created = await call(`${gw.url}/api/v1/batches`, {
      key,
      body: {
        endpoint: '/v1/chat/completions',
        model: 'sandbox/chat-1',
        requests: Array.from({ length: lines }, (_, i) => ({
          custom_id: `r${i}`,
          body: { messages: [{ role: 'user', content: `${i}` }] },
        })),
      },
    });
    expect(created.status, JSON.stringify(created.body)).to.equal(202);
    for (let i = 0; i < 600; i++) {
      const r = await call(`${gw.url}/api/v1/batches/${created.body.id}?include_results=false`, { key });
      if (r.body.status === 'completed') return created.body.id;
      await new Promise((res) => setTimeout(res, 100));
    }
    throw new Error('batch did not complete');
  }

  it('runs an admitted download to its end, refuses the next once the window is spent, and leaves reads without results alone', async function () {
    this.timeout(120_000);
    const [mine, theirs] = await Promise.all([finishedBatch(a.inferenceKey, 400), finishedBatch(b.inferenceKey, 400)]);
    await clearOfWindowEdge(60, 20_000);
    // 400 results are well over 128 KB: admitted, and sent whole.
    const first = await fetch(`${gw.url}/api/v1/batches/${mine}/results`, { headers: { authorization: `Bearer ${a.inferenceKey}` } });
    expect(first.status).to.equal(200);
    const text = await first.text();
    expect(text.length).to.be.above(128 * 1024);
    expect(text.trim().split('\n')).to.have.length(400);
    // The window is spent: the batch with its results inline, or its results, through any key.
    for (const [path, key] of [
      [`/batches/${mine}`, a.managementKey],
      [`/batches/${mine}/results`, a.inferenceKey],
    ]) {
      const refused = await call(`${gw.url}/api/v1${path}`, { key });
      expect(refused.status, path).to.equal(429);
      expect(refused.body.error.message).to.equal(
        'Result download limit exceeded: 128 KB of batch results per 60s for this workspace, over all its keys (include_results=false reads a batch without them)',
      );
      expect(refused.body.error.metadata).to.include({ limit_bytes: 128 * 1024, window_seconds: 60 });
      expect(Number(refused.headers.get('retry-after'))).to.be.within(1, 60);
    }
    // Without its results the batch is read as ever; another workspace downloads its own.
    const plain = await call(`${gw.url}/api/v1/batches/${mine}?include_results=false`, { key: a.inferenceKey });
    expect(plain.status).to.equal(200);
    expect(plain.body.request_counts.completed).to.equal(400);
    const other = await call(`${gw.url}/api/v1/batches/${theirs}`, { key: b.inferenceKey });
    expect(other.status).to.equal(200);
    expect(other.body.results).to.have.length(400);
  });
});
