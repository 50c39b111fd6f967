// Batches end to end against the real stack: lifecycle per endpoint, validation, failures inside a
// batch, fallback, cancel, expiry, list paging and filters, delete rules, isolation, durability.
import { expect } from 'chai';
import { stack } from './fixture';
import { call, createTenant, startTestGateway, type Tenant, type TestGateway } from './helpers';

export async function waitForStatus(url: string, key: string, id: string, statuses: string[], timeoutMs = 60_000): Promise<any> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const r = await call(`${url}/api/v1/batches/${id}`, { key });
    if (statuses.includes(r.body.status)) return r.body;
    if (r.status !== 200) throw new Error(`GET batch ${id}: ${r.status} ${typeof r.body === "string" ? r.body.slice(0, 300) : JSON.stringify(r.body).slice(0, 300)}`);
    if (Date.now() > deadline) throw new Error(`batch ${id} still ${r.body.status} (${JSON.stringify(r.body.request_counts)})`);
    await new Promise((res) => setTimeout(res, 150));
  }
}

describe('batches', () => {
  let gw: TestGateway;
  let t: Tenant;
  const create = (body: unknown, key?: string) => call(`${gw.url}/api/v1/batches`, { key: key ?? t.inferenceKey, body });

  before(async () => {
    gw = await startTestGateway({ env: { BATCH_CHUNK_SIZE: '7' } });
    t = await createTenant(gw.store, 10);
  });
  after(async () => { await gw.stop(); });

  it('runs a chat completions batch to completion with one result per line', async () => {
    const requests = Array.from({ length: 20 }, (_, i) => ({ custom_id: `req-${i}`, body: { messages: [{ role: 'user', content: `Question ${i}` }], max_tokens: 5 } }));
    const r = await create({ endpoint: '/v1/chat/completions', model: 'sandbox/chat-1', requests });
    expect(r.status, JSON.stringify(r.body)).to.equal(202);
    expect(r.body).to.include({ object: 'batch', status: 'validating', endpoint: '/v1/chat/completions', model: 'sandbox/chat-1', completion_window: '24h', results: null, error: null });
    expect(r.body.id).to.match(/^batch_/);
    expect(r.body.request_counts).to.deep.equal({ total: 20, completed: 0, failed: 0 });
    const done = await waitForStatus(gw.url, t.inferenceKey, r.body.id, ['completed', 'failed']);
    expect(done.status, JSON.stringify(done.error)).to.equal('completed');
    expect(done.request_counts).to.deep.equal({ total: 20, completed: 20, failed: 0 });
    expect(done.results).to.have.length(20);
    expect(done.results.map((x: any) => x.custom_id).sort()).to.deep.equal(requests.map((x) => x.custom_id).sort());
    expect(done.results[0].response.status_code).to.equal(200);
    expect(done.results[0].response.body.object).to.equal('chat.completion');
    expect(done.usage.cost).to.be.greaterThan(0);
    expect(done.finalized_at).to.be.a('number');
  });
});
