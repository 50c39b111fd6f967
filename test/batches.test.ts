// Batches end to end against the real stack: lifecycle per endpoint, validation, failures inside a
// batch, fallback, cancel, expiry, list paging and filters, delete rules, isolation, durability.
import { expect } from 'chai';
import http from 'node:http';
import path from 'node:path';
import { Client, Connection } from '@temporalio/client';
import { batches, createBatch, newBatchId, writeStatus, type BatchDoc } from '../domain/batches/store';
import { emptyTally, saveProgress } from '../domain/batches/progress';
import { storeInputs } from '../domain/batches/inputs';
import { Collection } from 'mongodb';
import { packLines } from '../domain/batches/packed-lines';
import { endpointEntry, modelEntry, providerEntry } from '../domain/catalog/entries';
import { batchProgressQuery, batchWorkflow } from '../workflows/batch';
import { searchAttributes, workflowMetadataQuery } from '../workflows/shared';
import { startProcess } from '../devstack/processes';
import { stack } from './fixture';
import { TRACE_MAX_JSON_LENGTH } from '../infrastructure/validation/types';
import {
  call,
  createTenant,
  startTestGateway,
  testBatchDoc,
  waitForStatus,
  writeTestCatalog,
  type Tenant,
  type TestGateway,
  storedUsage,
} from './helpers';

function batchCatalog(): string {
  return writeTestCatalog('batches', (base) => {
    const provider = (slug: string, faults: string, extra = {}) =>
      providerEntry(slug, `\${SANDBOX_URL}/~batchtest=1,${faults}/openai/v1`, extra);
    base.providers.push(
      provider('batch-broken', 'status=500'),
      provider('batch-slow', 'latency=250', { max_concurrency: 4 }),
      provider('batch-counted', 'counted=1'),
      provider('batch-cancel', 'cancelcheck=1,latency=100', { max_concurrency: 4 }),
      provider('batch-plain', 'plain=1'),
    );
    const model = (id: string, endpoints: [string, number][]) =>
      modelEntry(
        id,
        endpoints.map(([p, price]) => endpointEntry(p, price, { upstream_model: 'sandbox-chat' })),
        { context_length: 1000 },
      );
    base.models.push(
      model('test/batch-fallback', [
        ['batch-broken', 0.0001],
        ['sandbox-alpha', 5],
      ]),
      model('test/batch-slow', [['batch-slow', 1]]),
      model('test/batch-counted', [['batch-counted', 1]]),
      model('test/batch-cancel', [['batch-cancel', 1]]),
      model('test/batch-plain', [['batch-plain', 1]]),
    );
  });
}

const chatLine = (i: number, extra: Record<string, unknown> = {}) => ({
  custom_id: `req-${i}`,
  body: { messages: [{ role: 'user', content: `Question ${i}` }], max_tokens: 5, ...extra },
});
/** Calls the sandbox has had through the `batch-counted` provider, used by one test only. */
const countedCalls = async () =>
  Object.entries((await (await fetch(`${stack.sandboxUrl}/_calls`)).json()) as Record<string, number>)
    .filter(([k]) => k.includes('counted=1'))
    .reduce((a, [, n]) => a + n, 0);

/** A Temporal client on the run's server, closed once `use` is done. */
async function withTemporal<T>(use: (client: Client) => Promise<T>): Promise<T> {
  const connection = await Connection.connect({ address: stack.temporalAddress });
  try {
    return await use(new Client({ connection }));
  } finally {
    await connection.close();
  }
}

/** The activity types a batch's workflow scheduled, in order (its history). */
async function scheduledActivities(batchId: string): Promise<string[]> {
  return withTemporal(async (client) => {
    const history = await client.workflow.getHandle(batchId).fetchHistory();
    return (history.events ?? []).flatMap((e) =>
      e.activityTaskScheduledEventAttributes?.activityType?.name ? [e.activityTaskScheduledEventAttributes.activityType.name] : [],
    );
  });
}

describe('batches', () => {
  let gw: TestGateway;
  let t: Tenant;
  let catalogPath: string;
  const env = () => ({ BATCH_CHUNK_SIZE: '7', BATCH_MAX_REQUESTS: '1000', BATCH_MAX_BYTES: '256kb', CATALOG_PATH: catalogPath });
  const create = (body: unknown, key?: string) => call(`${gw.url}/api/v1/batches`, { key: key ?? t.inferenceKey, body });
  const get = (p: string, key?: string) => call(`${gw.url}/api/v1${p}`, { key: key ?? t.inferenceKey });

  before(async () => {
    catalogPath = batchCatalog();
    gw = await startTestGateway({ env: env() });
    t = await createTenant(gw.store, 10);
  });
  after(async () => {
    await gw.stop();
  });

  describe('lifecycle', () => {
    it('runs a chat completions batch to completion with one result per line', async () => {
      const requests = Array.from({ length: 20 }, (_, i) => chatLine(i));
      const r = await create({ endpoint: '/v1/chat/completions', model: 'sandbox/chat-1', requests, metadata: { team: 'risk' } });
      expect(r.status, JSON.stringify(r.body)).to.equal(202);
      expect(r.body).to.include({
        object: 'batch',
        status: 'validating',
        in_progress_at: null,
        endpoint: '/v1/chat/completions',
        model: 'sandbox/chat-1',
        completion_window: '24h',
        results: null,
        error: null,
        usage: null,
      });
      expect(r.body.id).to.match(/^batch_/);
      expect(r.body.metadata).to.deep.equal({ team: 'risk' });
      expect(r.body.expires_at - r.body.created_at).to.equal(24 * 3600);
      expect(r.body.request_counts).to.deep.equal({ total: 20, completed: 0, failed: 0 });
      const done = await waitForStatus(gw.url, t.inferenceKey, r.body.id, ['completed', 'failed']);
      expect(done.status, JSON.stringify(done.error)).to.equal('completed');
      expect(done.request_counts).to.deep.equal({ total: 20, completed: 20, failed: 0 });
      expect(done.results.map((x: any) => x.custom_id).sort()).to.deep.equal(requests.map((x) => x.custom_id).sort());
      for (const line of done.results) {
        expect(line.error).to.equal(null);
        expect(line.response.status_code).to.equal(200);
        expect(line.response.body.object).to.equal('chat.completion');
      }
      expect(done.in_progress_at).to.be.a('number');
      expect(done.finalized_at).to.be.a('number');
      expect(done.provider).to.be.oneOf(['sandbox-alpha', 'sandbox-beta']);
      // Usage: totals on the batch, one usage record per line, all debited.
      const records = await storedUsage(gw.store, { batch_id: r.body.id });
      expect(records).to.have.length(20);
      const cost = records.reduce((s, u) => s + u.cost, 0);
      expect(done.usage.cost).to.be.closeTo(cost, 1e-9);
      expect(done.usage.prompt_tokens).to.equal(records.reduce((s, u) => s + u.input_tokens, 0));
      expect(records[0]).to.include({
        kind: 'batch_line',
        workspace_id: t.workspaceId,
        key_id: t.inferenceKeyId,
        model: 'sandbox/chat-1-20261015',
      });
    });

    const endpoints: [string, string, (i: number) => Record<string, unknown>, (body: any) => void][] = [
      [
        '/v1/responses',
        'sandbox/chat-1',
        (i) => ({ input: `Hello ${i}`, max_output_tokens: 4 }),
        (b) => expect(b.object).to.equal('response'),
      ],
      [
        '/v1/messages',
        'sandbox/chat-1',
        (i) => ({ messages: [{ role: 'user', content: `Hi ${i}` }], max_tokens: 4 }),
        (b) => expect(b.type).to.equal('message'),
      ],
      [
        '/v1/embeddings',
        'sandbox/embed-1',
        (i) => ({ input: [`text ${i}`, 'more'], dimensions: 4 }),
        (b) => expect(b.data[1].embedding).to.have.length(4),
      ],
    ];
    for (const [endpoint, model, body, check] of endpoints) {
      it(`runs a ${endpoint} batch to completion`, async () => {
        // The messages batch is held to the Anthropic-format endpoint: served natively (test/translation.test.ts covers the others).
        const native = endpoint === '/v1/messages' ? { provider: { only: ['sandbox-claude'] } } : {};
        const requests = Array.from({ length: 9 }, (_, i) => ({ custom_id: `x${i}`, body: body(i) }));
        const r = await create({ endpoint, model, ...native, requests });
        expect(r.status, JSON.stringify(r.body)).to.equal(202);
        const done = await waitForStatus(gw.url, t.inferenceKey, r.body.id, ['completed', 'failed']);
        expect(done.status, JSON.stringify(done.error)).to.equal('completed');
        expect(done.request_counts).to.deep.equal({ total: 9, completed: 9, failed: 0 });
        for (const line of done.results) check(line.response.body);
        if (endpoint === '/v1/messages') expect(done.provider).to.equal('sandbox-claude');
      });
    }

    it('accepts the body with requests before endpoint and model (field order does not matter)', async () => {
      const text = `{"requests":[{"custom_id":"a","body":{"messages":[{"role":"user","content":"x"}]}}],"model":"sandbox/chat-1","endpoint":"/v1/chat/completions"}`;
      const r = await call(`${gw.url}/api/v1/batches`, { key: t.inferenceKey, body: text });
      expect(r.status, JSON.stringify(r.body)).to.equal(202);
      await waitForStatus(gw.url, t.inferenceKey, r.body.id, ['completed']);
    });

    it('applies a preset named in a line', async () => {
      await call(`${gw.url}/api/v1/presets/batch-sys/chat/completions`, {
        key: t.managementKey,
        body: {
          model: 'sandbox/chat-1',
          messages: [{ role: 'system', content: 'A long system prompt that adds quite a few prompt tokens to every request.' }],
        },
      });
      const r = await create({
        endpoint: '/v1/chat/completions',
        model: 'sandbox/chat-1',
        requests: [chatLine(1), { ...chatLine(2), body: { ...chatLine(1).body, preset: 'batch-sys' } }],
      });
      const done = await waitForStatus(gw.url, t.inferenceKey, r.body.id, ['completed']);
      const [plain, withPreset] = [...done.results].sort((a: any, b: any) => a.custom_id.localeCompare(b.custom_id));
      expect(withPreset.response.body.usage.prompt_tokens).to.be.greaterThan(plain.response.body.usage.prompt_tokens + 10);
    });
  });

  describe('synchronous validation', () => {
    const good = { endpoint: '/v1/chat/completions', model: 'sandbox/chat-1', requests: [chatLine(0)] };
    const cases: [string, unknown, number, string][] = [
      ['no endpoint', { model: good.model, requests: good.requests }, 400, 'endpoint: is required'],
      [
        'an unknown endpoint',
        { ...good, endpoint: '/v1/images' },
        400,
        'endpoint: must be one of "/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/embeddings"',
      ],
      ['no model', { endpoint: good.endpoint, requests: good.requests }, 400, 'model: is required'],
      ['empty requests', { ...good, requests: [] }, 400, 'requests: must NOT have fewer than 1 items'],
      ['a line without custom_id', { ...good, requests: [{ body: {} }] }, 400, 'requests[0].custom_id: is required'],
      [
        'a custom_id over 256',
        { ...good, requests: [{ custom_id: 'c'.repeat(257), body: {} }] },
        400,
        'requests[0].custom_id: must NOT have more than 256 characters',
      ],
      ['a body that is not an object', { ...good, requests: [{ custom_id: 'a', body: 'x' }] }, 400, 'requests[0].body: must be object'],
      ['provider keys other than only', { ...good, provider: { sort: 'price' } }, 400, 'provider.sort: is not an allowed field'],
      [
        'a metadata key over 64 characters',
        { ...good, metadata: { ['k'.repeat(65)]: 'v' } },
        400,
        `metadata: key "${'k'.repeat(40)}"…: must NOT have more than 64 characters`,
      ],
      ['a metadata value that is not a string', { ...good, metadata: { team: 7 } }, 400, 'metadata.team: must be string'],
      [
        'a bad completion window',
        { ...good, completion_window: '1d' },
        400,
        'completion_window: must match pattern "^([1-9]|[1-9][0-9]|1[0-5][0-9]|16[0-8])h$"',
      ],
      [
        'a line naming another model',
        { ...good, requests: [{ custom_id: 'a', body: { model: 'sandbox/embed-1', messages: [] } }] },
        400,
        'requests[0].body.model: must match the batch model sandbox/chat-1 (custom_id "a")',
      ],
      ['an unknown model', { ...good, model: 'nope/none' }, 404, 'Model "nope/none" not found'],
      [
        'provider.only matching nothing',
        { ...good, provider: { only: ['nobody'] } },
        404,
        'No endpoint of sandbox/chat-1 satisfies provider.only',
      ],
      [
        'a model that does not serve the endpoint',
        { ...good, endpoint: '/v1/embeddings' },
        404,
        'No endpoint of sandbox/chat-1 serves embeddings',
      ],
      [
        'a duplicate custom_id',
        { ...good, requests: [chatLine(1), chatLine(2), chatLine(1)] },
        422,
        'requests[2].custom_id: duplicate custom_id "req-1" (also at requests[0])',
      ],
      [
        'too many lines',
        { ...good, requests: Array.from({ length: 1001 }, (_, i) => ({ custom_id: `${i}`, body: {} })) },
        413,
        'requests: 1001 lines, more than the limit of 1000',
      ],
    ];
    for (const [name, body, status, message] of cases) {
      it(`${status} for ${name}`, async () => {
        const r = await create(body);
        expect(r.status, JSON.stringify(r.body)).to.equal(status);
        expect(r.body.error).to.include({ code: status, message });
      });
    }

    it('accepts a line whose model is an alias of the batch model', async () => {
      const r = await create({ ...good, requests: [{ custom_id: 'a', body: { ...chatLine(0).body, model: 'sandbox/chat-1-20261015' } }] });
      expect(r.status).to.equal(202);
    });

    it('413 over the size limit, 402 without credits, 401 without a key', async () => {
      const big = await create({
        ...good,
        requests: Array.from({ length: 300 }, (_, i) => ({
          custom_id: `${i}`,
          body: { messages: [{ role: 'user', content: 'x'.repeat(1000) }] },
        })),
      });
      expect(big.status).to.equal(413);
      const broke = await createTenant(gw.store, 0);
      expect((await create(good, broke.inferenceKey)).status).to.equal(402);
      expect((await call(`${gw.url}/api/v1/batches`, { body: good })).status).to.equal(401);
    });
  });

  describe('running', () => {
    it("sends a line to the provider without the gateway's own fields, as a synchronous call is sent", async () => {
      const plain = chatLine(0).body;
      const r = await create({
        endpoint: '/v1/chat/completions',
        model: 'test/batch-plain',
        requests: [
          { custom_id: 'plain', body: plain },
          {
            custom_id: 'annotated',
            body: {
              ...plain,
              session_id: 's-1',
              trace: { trace_id: 't-1' },
              usage: { include: true },
              transforms: [],
              models: ['test/batch-plain'],
            },
          },
        ],
      });
      expect(r.status, JSON.stringify(r.body)).to.equal(202);
      const done = await waitForStatus(gw.url, t.inferenceKey, r.body.id, ['completed', 'failed']);
      expect(done.status, JSON.stringify(done.error)).to.equal('completed');
      // The sandbox's answer is a function of the exact body it received: the same answer, the same body.
      const ids = Object.fromEntries(done.results.map((x: any) => [x.custom_id, x.response.body.id]));
      expect(ids.annotated).to.be.a('string').and.equal(ids.plain);
    });

    it('fails the whole batch for invalid lines, naming them, with nothing sent upstream', async () => {
      const r = await create({
        endpoint: '/v1/chat/completions',
        model: 'test/batch-counted',
        requests: [
          chatLine(0),
          { custom_id: 'streams', body: { ...chatLine(1).body, stream: true } },
          { custom_id: 'no-messages', body: { max_tokens: 3 } },
          // The attribution fields a line may carry are bounded as in a synchronous call.
          { custom_id: 'big-trace', body: { ...chatLine(3).body, trace: { x: 'v'.repeat(TRACE_MAX_JSON_LENGTH) } } },
          { custom_id: 'long-session', body: { ...chatLine(4).body, session_id: 's'.repeat(257) } },
          chatLine(5),
        ],
      });
      expect(r.status).to.equal(202);
      const done = await waitForStatus(gw.url, t.inferenceKey, r.body.id, ['completed', 'failed']);
      expect(done.status).to.equal('failed');
      expect(done.error.message)
        .to.include('4 request line(s) are invalid')
        .and.include('streams (stream: must be false (batches do not stream))')
        .and.include('no-messages (messages: is required)')
        .and.include(`big-trace (trace: must NOT be longer than ${TRACE_MAX_JSON_LENGTH} characters as JSON)`)
        .and.include('long-session (session_id: must NOT have more than 256 characters)');
      expect(done.results).to.equal(null);
      expect(done.request_counts).to.deep.equal({ total: 6, completed: 0, failed: 6 });
      expect(await countedCalls()).to.equal(0);
      // The lines were checked at creation: the workflow only closes the batch, with no validation step.
      expect(await scheduledActivities(r.body.id)).to.deep.equal(['closeBatch']);
      // The same provider does get called by a valid batch, so the count above means something.
      const valid = await create({ endpoint: '/v1/chat/completions', model: 'test/batch-counted', requests: [chatLine(0)] });
      await waitForStatus(gw.url, t.inferenceKey, valid.body.id, ['completed']);
      expect(await countedCalls()).to.equal(1);
      expect(await gw.store.usage.countDocuments({ batch_id: r.body.id })).to.equal(0);
    });

    it('keeps going past a line that fails upstream: a failed line, not a failed batch', async () => {
      const requests = [0, 1, 2, 3].map((i) => ({ custom_id: `e${i}`, body: { input: `t${i}`, dimensions: i === 2 ? 5000 : 4 } }));
      const r = await create({ endpoint: '/v1/embeddings', model: 'sandbox/embed-1', requests });
      const done = await waitForStatus(gw.url, t.inferenceKey, r.body.id, ['completed', 'failed']);
      expect(done.status).to.equal('completed');
      expect(done.request_counts).to.deep.equal({ total: 4, completed: 3, failed: 1 });
      const bad = done.results.find((x: any) => x.custom_id === 'e2');
      expect(bad.response).to.equal(null);
      expect(bad.error).to.include({ type: 'upstream_error', code: 502 });
      expect(bad.error.message).to.include('dimensions');
      expect(await gw.store.usage.countDocuments({ batch_id: r.body.id })).to.equal(3); // failed lines are not billed
    });

    it('falls back to the next provider inside a batch', async () => {
      const r = await create({
        endpoint: '/v1/chat/completions',
        model: 'test/batch-fallback',
        requests: Array.from({ length: 6 }, (_, i) => chatLine(i)),
      });
      const done = await waitForStatus(gw.url, t.inferenceKey, r.body.id, ['completed', 'failed']);
      expect(done.request_counts).to.deep.equal({ total: 6, completed: 6, failed: 0 });
      expect(done.provider).to.equal('sandbox-alpha');
    });

    it('streams results as JSON Lines, paged by after and limit', async () => {
      const r = await create({
        endpoint: '/v1/chat/completions',
        model: 'sandbox/chat-1',
        requests: Array.from({ length: 10 }, (_, i) => chatLine(i)),
      });
      await waitForStatus(gw.url, t.inferenceKey, r.body.id, ['completed']);
      const res = await fetch(`${gw.url}/api/v1/batches/${r.body.id}/results`, { headers: { authorization: `Bearer ${t.inferenceKey}` } });
      expect(res.headers.get('content-type')).to.include('application/jsonl');
      const lines = (await res.text())
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l));
      expect(lines.map((l) => l.line)).to.deep.equal([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
      expect(lines[3]).to.include({ custom_id: 'req-3' });
      const page = await fetch(`${gw.url}/api/v1/batches/${r.body.id}/results?after=4&limit=3`, {
        headers: { authorization: `Bearer ${t.inferenceKey}` },
      });
      expect(
        (await page.text())
          .trim()
          .split('\n')
          .map((l) => JSON.parse(l).line),
      ).to.deep.equal([5, 6, 7]);
    });

    it('a workspace may have 4 result streams open at once (429 past that), without holding back another workspace', async function () {
      this.timeout(60_000);
      const other = await createTenant(gw.store, 10);
      // Results long enough (13 MB, past what sockets and streams buffer) that a stream the client
      // does not read stays open, even when its pages are read from memory.
      const r = await create({
        endpoint: '/v1/embeddings',
        model: 'sandbox/embed-1',
        requests: Array.from({ length: 300 }, (_, i) => ({
          custom_id: `e${i}`,
          body: { input: `t${i}`, dimensions: 2048, encoding_format: 'float' },
        })),
      });
      expect(r.status, JSON.stringify(r.body)).to.equal(202);
      await waitForStatus(gw.url, t.inferenceKey, r.body.id, ['completed']);
      const url = new URL(`${gw.url}/api/v1/batches/${r.body.id}/results`);
      const open: http.ClientRequest[] = [];
      const start = () =>
        new Promise<http.IncomingMessage>((resolve, reject) => {
          const req = http.get(url, { headers: { authorization: `Bearer ${t.inferenceKey}` } }, (res) => {
            res.pause(); // read nothing: the stream stays open
            resolve(res);
          });
          req.on('error', reject);
          open.push(req);
        });
      try {
        for (let i = 0; i < 4; i++) expect((await start()).statusCode).to.equal(200);
        const fifth = await call(url.toString(), { key: t.inferenceKey });
        expect(fifth.status).to.equal(429);
        expect(fifth.body.error.message).to.match(/At most 4 reads of batch results/);
        expect(fifth.headers.get('retry-after')).to.equal('1');
        // Another workspace is not held back.
        expect((await get('/batches', other.inferenceKey)).status).to.equal(200);
        // One stream closed by its client: the slot is free again.
        open.shift()!.destroy();
        let again = await call(`${url}?limit=5`, { key: t.inferenceKey });
        for (let i = 0; again.status === 429 && i < 50; i++) {
          await new Promise((res) => setTimeout(res, 20));
          again = await call(`${url}?limit=5`, { key: t.inferenceKey });
        }
        expect(again.status).to.equal(200);
        expect(again.body.trim().split('\n')).to.have.length(5);
      } finally {
        for (const req of open) req.destroy();
      }
    });

    it('cancel: cancelling, then cancelled; finished lines keep results, the rest get batch_cancelled', async () => {
      const r = await create({
        endpoint: '/v1/chat/completions',
        model: 'test/batch-slow',
        requests: Array.from({ length: 40 }, (_, i) => chatLine(i)),
      });
      // Cancel once some lines are done (and most are not).
      for (let i = 0; i < 200 && (await get(`/batches/${r.body.id}`)).body.request_counts.completed < 2; i++)
        await new Promise((res) => setTimeout(res, 25));
      const c = await call(`${gw.url}/api/v1/batches/${r.body.id}/cancel`, { method: 'POST', key: t.inferenceKey });
      expect(c.status).to.equal(200);
      expect(c.body.status).to.equal('cancelling');
      const done = await waitForStatus(gw.url, t.inferenceKey, r.body.id, ['cancelled'], 30_000);
      const ok = done.results.filter((x: any) => x.response);
      const cancelled = done.results.filter((x: any) => x.error?.type === 'batch_cancelled');
      expect(done.results).to.have.length(40);
      expect(ok.length).to.be.greaterThan(0);
      expect(cancelled.length).to.be.greaterThan(0);
      expect(ok.length + cancelled.length).to.equal(40);
      const diag = JSON.stringify({
        types: done.results.map((x: any) => x.error?.type ?? 'ok'),
        progress: await gw.store.db
          .collection('batch_progress')
          .find({ _id: { $regex: `^${r.body.id}:` } as never })
          .toArray(),
      });
      expect(done.request_counts, diag).to.deep.equal({ total: 40, completed: ok.length, failed: cancelled.length });
      // Every chunk ends with its page (chunks here are shorter than a page): the ones the cancel cut
      // short are paged by the close, so readers read pages, not lines.
      const stored = await gw.store.db.collection('batches').findOne({ _id: r.body.id });
      expect(await gw.store.db.collection('batch_pages').countDocuments({ _id: { $regex: `^${r.body.id}:` } as never })).to.equal(
        stored!.chunks,
      );
      const again = await call(`${gw.url}/api/v1/batches/${r.body.id}/cancel`, { method: 'POST', key: t.inferenceKey });
      expect(again.status).to.equal(409);
    });

    it('cancelling a batch stored as cancelling sends its workflow no signal more', async () => {
      // 200 lines of 250 ms, 4 at a time: running for ~12 s.
      const r = await create({
        endpoint: '/v1/chat/completions',
        model: 'test/batch-slow',
        requests: Array.from({ length: 200 }, (_, i) => chatLine(i)),
      });
      const signals = () =>
        withTemporal(async (client) => {
          const history = await client.workflow.getHandle(r.body.id).fetchHistory();
          return (history.events ?? []).filter((e) => e.workflowExecutionSignaledEventAttributes).length;
        });
      const cancel = () => call(`${gw.url}/api/v1/batches/${r.body.id}/cancel`, { method: 'POST', key: t.inferenceKey });
      const stored = (await gw.store.db.collection<BatchDoc>('batches').findOne({ _id: r.body.id }))!;
      // As the workflow stores it once it has had a cancel.
      await writeStatus(gw.store, stored, { status: 'cancelling' });
      for (let i = 0; i < 5; i++) expect((await cancel()).body.status).to.equal('cancelling');
      await writeStatus(gw.store, stored, { status: 'in_progress' });
      expect((await cancel()).body.status).to.equal('cancelling');
      await waitForStatus(gw.url, t.inferenceKey, r.body.id, ['cancelled'], 30_000);
      // Counted once the run is over: signals that arrive during a workflow task join its history after it.
      expect(await signals()).to.equal(1);
    });

    it('a cancelled batch closes only once its chunks have stopped: no provider call and no result after it is cancelled', async () => {
      const calls = async () =>
        Object.entries((await (await fetch(`${stack.sandboxUrl}/_calls`)).json()) as Record<string, number>)
          .filter(([k]) => k.includes('cancelcheck=1'))
          .reduce((a, [, n]) => a + n, 0);
      const r = await create({
        endpoint: '/v1/chat/completions',
        model: 'test/batch-cancel',
        requests: Array.from({ length: 60 }, (_, i) => chatLine(i)),
      });
      for (let i = 0; i < 100 && (await get(`/batches/${r.body.id}`)).body.request_counts.completed < 4; i++)
        await new Promise((res) => setTimeout(res, 50));
      await call(`${gw.url}/api/v1/batches/${r.body.id}/cancel`, { method: 'POST', key: t.inferenceKey });
      const done = await waitForStatus(gw.url, t.inferenceKey, r.body.id, ['cancelled'], 30_000);
      const results = () => gw.store.db.collection('batch_results').countDocuments({ _id: { $regex: `^${r.body.id}:` } as never });
      const [callsAtClose, resultsAtClose] = [await calls(), await results()];
      // Long enough for a chunk that had not seen the cancel to make a few more calls (100 ms each).
      await new Promise((res) => setTimeout(res, 1500));
      expect(await calls(), 'provider calls after the batch was cancelled').to.equal(callsAtClose);
      expect(await results()).to.equal(resultsAtClose);
      expect(resultsAtClose).to.equal(60);
      expect(done.request_counts.completed + done.request_counts.failed).to.equal(60);
      expect(await gw.store.usage.countDocuments({ batch_id: r.body.id })).to.equal(done.request_counts.completed);
    });

    // In chunks of 7 (a window of chunk activities), and as one chunk (one activity runs and closes it).
    for (const chunkSize of [7, 80]) {
      it(`expiry: when the completion window ends the batch is expired; finished lines keep their results (chunks of ${chunkSize})`, async () => {
        // The workflow under test, started directly with a two-second window (the API accepts whole hours).
        const id = newBatchId();
        const lines = Array.from({ length: 80 }, (_, i) => ({
          line: i,
          custom_id: chatLine(i).custom_id,
          body: JSON.stringify(chatLine(i).body),
        }));
        const starts = await storeInputs(gw.store, { _id: id }, packLines(lines), chunkSize);
        const chunks = starts.length;
        const now = new Date();
        const doc = testBatchDoc(t, {
          _id: id,
          model: 'test/batch-slow',
          completion_window: '1h',
          status: 'validating',
          in_progress_at: null,
          created_at: now,
          expires_at: new Date(now.getTime() + 2000),
          total: 80,
          chunks,
          chunk_starts: starts,
        });
        await batches(gw.store).insertOne(doc);
        await withTemporal(async (client) => {
          await client.workflow.start(batchWorkflow, {
            workflowId: id,
            taskQueue: gw.config.temporal.taskQueue,
            args: [
              {
                batchId: id,
                chunks,
                window: 2,
                heartbeatTimeoutMs: gw.config.batches.heartbeatTimeoutMs,
                expiresAt: doc.expires_at.getTime(),
                phase: 'validate',
                nextChunk: 0,
                cancelRequested: false,
                lines: 80,
              },
            ],
          });
        });
        const done = await waitForStatus(gw.url, t.inferenceKey, id, ['expired'], 30_000);
        const ok = done.results.filter((x: any) => x.response);
        const expired = done.results.filter((x: any) => x.error?.type === 'batch_expired');
        expect(ok.length).to.be.greaterThan(0);
        expect(expired.length).to.be.greaterThan(0);
        expect(ok.length + expired.length).to.equal(80);
        expect(expired[0].error.message).to.equal('The batch expired before this request was processed');
        expect(await scheduledActivities(id)).to.include(chunkSize === 80 ? 'processOnlyChunk' : 'processBatchChunk');
      });
    }
  });

  describe('list, delete and isolation', () => {
    let tenant: Tenant;
    const ids: string[] = [];
    before(async () => {
      tenant = await createTenant(gw.store, 5);
      // Three finished batches created a few seconds apart, stored directly (no waiting for the clock).
      const now = Date.now();
      for (let i = 0; i < 3; i++) {
        const at = new Date(now - (3 - i) * 5_000);
        const doc = testBatchDoc(tenant, {
          model: 'sandbox/chat-1',
          status: 'completed',
          created_at: at,
          finalized_at: at,
          total: 1,
          provider: 'sandbox-alpha',
          final_counts: { completed: 1, failed: 0 },
        });
        ids.push(
          (await createBatch(gw.store, doc, packLines([{ custom_id: `req-${i}`, body: JSON.stringify(chatLine(i).body) }]), 10))._id,
        );
      }
    });

    it('lists newest first, pages with after/last_id, never includes results', async () => {
      const first = await get('/batches?limit=2', tenant.inferenceKey);
      expect(first.status).to.equal(200);
      expect(first.body).to.include({ object: 'list', has_more: true, first_id: ids[2], last_id: ids[1] });
      expect(first.body.data.map((b: any) => b.id)).to.deep.equal([ids[2], ids[1]]);
      for (const b of first.body.data) expect(b.results).to.equal(null);
      const second = await get(`/batches?limit=2&after=${first.body.last_id}`, tenant.inferenceKey);
      expect(second.body.data.map((b: any) => b.id)).to.deep.equal([ids[0]]);
      expect(second.body.has_more).to.equal(false);
    });

    it("a list of running batches reads their chunks' progress together: one read, not a few per batch", async () => {
      const runner = await createTenant(gw.store, 5);
      // 12 running batches of 3 chunks (7 lines each): chunk 0 of each half-way, the others not started.
      const running: string[] = [];
      for (let i = 0; i < 12; i++) {
        const doc = testBatchDoc(runner, { model: 'sandbox/chat-1', total: 21 });
        const lines = Array.from({ length: 21 }, (_, n) => ({ custom_id: `r${n}`, body: JSON.stringify(chatLine(n).body) }));
        const b = await createBatch(gw.store, doc, packLines(lines), 7);
        await saveProgress(gw.store, b, 0, { ...emptyTally(), completed: i }, []);
        running.push(b._id);
      }
      const finds: unknown[] = [];
      const find = Collection.prototype.find;
      Collection.prototype.find = function (this: Collection, ...args: Parameters<typeof find>) {
        if (this.collectionName === 'batch_progress') finds.push(args[0]);
        return find.apply(this, args);
      } as typeof find;
      try {
        const list = await get('/batches?limit=20', runner.inferenceKey);
        expect(list.status).to.equal(200);
        expect(list.body.data.map((b: any) => b.id)).to.deep.equal([...running].reverse());
        expect(list.body.data.map((b: any) => b.request_counts.completed)).to.deep.equal(running.map((_, i) => i).reverse());
      } finally {
        Collection.prototype.find = find;
      }
      // Every chunk of every batch in one read (one by one, they were 24).
      expect(finds).to.have.length(1);
    });

    it('filters by repeated status and strict created_after / created_before', async () => {
      expect((await get('/batches?status=completed&status=failed', tenant.inferenceKey)).body.data).to.have.length(3);
      expect((await get('/batches?status=in_progress', tenant.inferenceKey)).body.data).to.have.length(0);
      const middle = (await get(`/batches/${ids[1]}`, tenant.inferenceKey)).body.created_at;
      const after = await get(`/batches?created_after=${middle}`, tenant.inferenceKey);
      expect(after.body.data.map((b: any) => b.id)).to.deep.equal([ids[2]]);
      const before = await get(`/batches?created_before=${new Date(middle * 1000).toISOString()}`, tenant.inferenceKey);
      expect(before.body.data.map((b: any) => b.id)).to.deep.equal([ids[0]]);
    });

    it('400 for bad list parameters', async () => {
      for (const q of [
        'limit=0',
        'limit=101',
        'limit=x',
        'status=done',
        'created_after=yesterday',
        'after=nope',
        'colour=red',
        // Outside the range of dates: these matched everything or nothing.
        'created_after=99999999999999',
        'created_before=99999999999999',
        'created_after=-271822-01-01T00:00:00Z',
        'created_before=%2B275761-01-01T00:00:00Z',
        // A well-formed cursor that is no batch of this workspace (it restarted the list), or another's.
        'after=batch_zzzzzzzzzzzz0000000000000000',
        `after=${ids[0]}`,
      ]) {
        const r = await get(`/batches?${q}`, q === `after=${ids[0]}` ? t.inferenceKey : tenant.inferenceKey);
        expect(r.status, q).to.equal(400);
        expect(r.body.error.code).to.equal(400);
      }
    });

    it("never shows one workspace another's batches", async () => {
      expect((await get(`/batches/${ids[0]}`, t.inferenceKey)).status).to.equal(404);
      expect((await get(`/batches/${ids[0]}/results`, t.inferenceKey)).status).to.equal(404);
      expect((await call(`${gw.url}/api/v1/batches/${ids[0]}/cancel`, { method: 'POST', key: t.inferenceKey })).status).to.equal(404);
      expect((await call(`${gw.url}/api/v1/batches/${ids[0]}`, { method: 'DELETE', key: t.inferenceKey })).status).to.equal(404);
      const mine = (await get('/batches?limit=100', t.inferenceKey)).body.data.map((b: any) => b.id);
      expect(mine).to.not.include.members(ids);
    });

    it('deletes only terminal batches; the usage records stay; a later get is 404', async () => {
      const running = await create(
        { endpoint: '/v1/chat/completions', model: 'test/batch-slow', requests: Array.from({ length: 16 }, (_, i) => chatLine(i)) },
        tenant.inferenceKey,
      );
      const conflict = await call(`${gw.url}/api/v1/batches/${running.body.id}`, { method: 'DELETE', key: tenant.inferenceKey });
      expect(conflict.status).to.equal(409);
      expect(conflict.body.error.code).to.equal(409);
      const finished = (
        await create({ endpoint: '/v1/chat/completions', model: 'sandbox/chat-1', requests: [chatLine(0)] }, tenant.inferenceKey)
      ).body.id;
      await waitForStatus(gw.url, tenant.inferenceKey, finished, ['completed']);
      const usageBefore = await gw.store.usage.countDocuments({ batch_id: finished });
      expect(usageBefore).to.equal(1);
      // Every document of the batch, in the collections batches share (and any of its own).
      const left = async () => {
        const counts = await Promise.all(
          ['batch_inputs', 'batch_results', 'batch_progress', 'batch_pages', 'batch_deletions'].map((c) =>
            gw.store.db.collection(c).countDocuments({ _id: { $regex: `^${finished}` } as never }),
          ),
        );
        const own = (await gw.store.db.listCollections().toArray()).map((c) => c.name).filter((n) => n.startsWith(`${finished}_`));
        return { inputs: counts[0], results: counts[1], progress: counts[2], pages: counts[3], marker: counts[4], own: own.length };
      };
      expect(await left()).to.deep.equal({ inputs: 1, results: 1, progress: 1, pages: 1, marker: 0, own: 0 });
      // Listed first, so the process keeps its settled document; once deleted it is not listed.
      const listed = async () => (await get('/batches?limit=100', tenant.inferenceKey)).body.data.map((b: any) => b.id);
      expect(await listed()).to.include(finished);
      const del = await call(`${gw.url}/api/v1/batches/${finished}`, { method: 'DELETE', key: tenant.inferenceKey });
      expect(del.body).to.deep.equal({ id: finished, object: 'batch.deleted', deleted: true });
      expect((await get(`/batches/${finished}`, tenant.inferenceKey)).status).to.equal(404);
      expect(await listed()).to.not.include(finished);
      expect(await gw.store.usage.countDocuments({ batch_id: finished })).to.equal(usageBefore);
      // Its lines go in the background, behind a marker that goes last.
      let remaining = await left();
      for (let i = 0; i < 100 && Object.values(remaining).some(Boolean); i++) {
        await new Promise((r) => setTimeout(r, 50));
        remaining = await left();
      }
      expect(remaining).to.deep.equal({ inputs: 0, results: 0, progress: 0, pages: 0, marker: 0, own: 0 });
      await call(`${gw.url}/api/v1/batches/${running.body.id}/cancel`, { method: 'POST', key: tenant.inferenceKey });
    });
  });

  it('is one Temporal workflow per batch, with search attributes and a progress query', async () => {
    const r = await create({
      endpoint: '/v1/chat/completions',
      model: 'test/batch-slow',
      requests: Array.from({ length: 24 }, (_, i) => chatLine(i)),
    });
    await withTemporal(async (client) => {
      const handle = client.workflow.getHandle(r.body.id);
      await waitForStatus(gw.url, t.inferenceKey, r.body.id, ['in_progress']);
      const progress = await handle.query(batchProgressQuery);
      expect(progress).to.include({ status: 'in_progress', chunks: 4 });
      // What the Web UI shows: the details it reads through Temporal's built-in metadata query.
      const details = async () => (await handle.query(workflowMetadataQuery)).currentDetails;
      expect(await details()).to.match(/^\*\*in_progress\*\* · \d+ of 24 lines done \(\d+ completed, 0 failed\) · \d of 4 chunks$/);
      await waitForStatus(gw.url, t.inferenceKey, r.body.id, ['completed'], 30_000);
      // The batch reads completed once the close activity stored it; the workflow's details follow
      // in its next task (a query between the two read "finalizing"): read them once it has ended.
      await handle.result();
      expect(await details()).to.equal('**completed** · 24 of 24 lines done (24 completed, 0 failed) · 4 of 4 chunks');
      const d = await handle.describe();
      expect(await d.staticSummary()).to.equal(
        `batch · 24 lines · /v1/chat/completions · test/batch-slow-20260101 · workspace ${t.workspaceId} · key ${t.inferenceKeyId}`,
      );
      expect(await d.staticDetails())
        .to.include(`**Batch** ${r.body.id}`)
        .and.include('- lines: 24 in 4 chunk(s)');
      expect(d.type).to.equal(batchWorkflow.name);
      expect(d.typedSearchAttributes.get(searchAttributes.batchStatus)).to.equal('completed');
      expect(d.typedSearchAttributes.get(searchAttributes.workspace)).to.equal(t.workspaceId);
      expect(d.typedSearchAttributes.get(searchAttributes.model)).to.equal('test/batch-slow');
      // The lines were checked at creation (the batch was stored in_progress), and the close writes
      // finalizing itself: the chunks and the close are the only round trips.
      const names = await scheduledActivities(r.body.id);
      expect(names).to.deep.equal(['processBatchChunk', 'processBatchChunk', 'processBatchChunk', 'processBatchChunk', 'closeBatch']);
      const history = await handle.fetchHistory();
      // Each chunk activity names its chunk in the UI.
      const summaries = (history.events ?? []).flatMap((e) => {
        const data = e.userMetadata?.summary?.data;
        return e.activityTaskScheduledEventAttributes && data ? [JSON.parse(Buffer.from(data).toString())] : [];
      });
      expect(summaries.sort()).to.deep.equal(['chunk 1 of 4', 'chunk 2 of 4', 'chunk 3 of 4', 'chunk 4 of 4']);
    });
  });

  it('a batch of one chunk is run and closed by one activity, with the same results, details and attributes', async () => {
    const r = await create({
      endpoint: '/v1/chat/completions',
      model: 'sandbox/chat-1',
      requests: [0, 1, 2, 3, 4].map((i) => chatLine(i)),
    });
    const done = await waitForStatus(gw.url, t.inferenceKey, r.body.id, ['completed', 'failed']);
    expect(done.status, JSON.stringify(done.error)).to.equal('completed');
    expect(done.request_counts).to.deep.equal({ total: 5, completed: 5, failed: 0 });
    expect(done.results.map((x: any) => x.custom_id).sort()).to.deep.equal([0, 1, 2, 3, 4].map((i) => chatLine(i).custom_id).sort());
    expect(done.finalized_at).to.be.a('number');
    expect(await storedUsage(gw.store, { batch_id: r.body.id })).to.have.length(5);
    expect(await scheduledActivities(r.body.id)).to.deep.equal(['processOnlyChunk']);
    await withTemporal(async (client) => {
      const handle = client.workflow.getHandle(r.body.id);
      expect((await handle.query(workflowMetadataQuery)).currentDetails).to.equal(
        '**completed** · 5 of 5 lines done (5 completed, 0 failed) · 1 of 1 chunks',
      );
      expect(await handle.query(batchProgressQuery)).to.include({ status: 'completed', chunks: 1, chunks_done: 1 });
      expect((await handle.describe()).typedSearchAttributes.get(searchAttributes.batchStatus)).to.equal('completed');
    });
  });

  it('cancel of a batch of one chunk: its activity stops; finished lines keep results, the rest get batch_cancelled', async () => {
    const one = await startTestGateway({ env: { ...env(), BATCH_CHUNK_SIZE: '100' } });
    try {
      const tenant = await createTenant(one.store, 10);
      const r = await call(`${one.url}/api/v1/batches`, {
        key: tenant.inferenceKey,
        body: { endpoint: '/v1/chat/completions', model: 'test/batch-slow', requests: Array.from({ length: 40 }, (_, i) => chatLine(i)) },
      });
      expect(r.status).to.equal(202);
      const counts = async () => (await call(`${one.url}/api/v1/batches/${r.body.id}`, { key: tenant.inferenceKey })).body.request_counts;
      for (let i = 0; i < 200 && (await counts()).completed < 2; i++) await new Promise((res) => setTimeout(res, 25));
      const c = await call(`${one.url}/api/v1/batches/${r.body.id}/cancel`, { method: 'POST', key: tenant.inferenceKey });
      expect(c.status).to.equal(200);
      const done = await waitForStatus(one.url, tenant.inferenceKey, r.body.id, ['cancelled'], 30_000);
      const ok = done.results.filter((x: any) => x.response);
      const cancelled = done.results.filter((x: any) => x.error?.type === 'batch_cancelled');
      expect(ok.length).to.be.greaterThan(0);
      expect(cancelled.length).to.be.greaterThan(0);
      expect(ok.length + cancelled.length).to.equal(40);
      expect(done.request_counts).to.deep.equal({ total: 40, completed: ok.length, failed: cancelled.length });
      // The chunk's activity did not close the batch: the workflow's own close did, as cancelled.
      expect(await scheduledActivities(r.body.id)).to.deep.equal(['processOnlyChunk', 'closeBatch']);
    } finally {
      await one.stop();
    }
  });

  it('continues as new every 100 chunks, keeping each run small, and still answers every line', async function () {
    this.timeout(120_000);
    // Chunks of 7 lines: 720 lines are 103 chunks, so the workflow continues as new once.
    const r = await create({
      endpoint: '/v1/embeddings',
      model: 'sandbox/embed-1',
      requests: Array.from({ length: 720 }, (_, i) => ({ custom_id: `e${i}`, body: { input: `t${i}`, dimensions: 2 } })),
    });
    expect(r.status).to.equal(202);
    const done = await waitForStatus(gw.url, t.inferenceKey, r.body.id, ['completed', 'failed'], 100_000);
    expect(done.request_counts).to.deep.equal({ total: 720, completed: 720, failed: 0 });
    expect(done.results.map((x: any) => x.custom_id)).to.deep.equal(Array.from({ length: 720 }, (_, i) => `e${i}`));
    // Streamed in pieces of ~64 KB (several here): every line whole, in order, once.
    const jsonl = await fetch(`${gw.url}/api/v1/batches/${r.body.id}/results`, { headers: { authorization: `Bearer ${t.inferenceKey}` } });
    const text = await jsonl.text();
    expect(text.length).to.be.greaterThan(2 * 64 * 1024);
    const lines = text
      .trimEnd()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(lines.map((l) => [l.line, l.custom_id])).to.deep.equal(Array.from({ length: 720 }, (_, i) => [i, `e${i}`]));
    await withTemporal(async (client) => {
      const runs = [];
      for await (const w of client.workflow.list({ query: `WorkflowId = '${r.body.id}'` })) runs.push(w);
      expect(runs.map((w) => w.status.name).sort()).to.deep.equal(['COMPLETED', 'CONTINUED_AS_NEW']);
      for (const w of runs) expect(w.historyLength).to.be.lessThan(1000);
    });
  });

  // In chunks of 7, and as one chunk whose activity also closes the batch (retried whole: lines resumed, closed once).
  for (const shape of [
    { chunkSize: '7', activity: 'processBatchChunk' },
    { chunkSize: '100', activity: 'processOnlyChunk' },
  ]) {
    it(`survives the worker being killed mid-batch: exactly one result per line (chunks of ${shape.chunkSize})`, async function () {
      this.timeout(120_000);
      // An API without a worker, and a worker in a process of its own that we can kill.
      // A chunk whose worker died moves after 3 s of silence rather than the default 10 s.
      const api = await startTestGateway({
        withWorker: false,
        env: { ...env(), BATCH_CHUNK_SIZE: shape.chunkSize, BATCH_HEARTBEAT_TIMEOUT_MS: '3000' },
      });
      const tenant = await createTenant(api.store, 5);
      const bin = path.resolve(__dirname, '..', '..', 'bin', 'gateway.js');
      const workerEnv = {
        ...process.env,
        MONGODB_URI: stack.mongoUri,
        MONGODB_DATABASE: api.config.mongo.database,
        TEMPORAL_ADDRESS: stack.temporalAddress,
        TEMPORAL_TASK_QUEUE: api.config.temporal.taskQueue,
        SANDBOX_URL: stack.sandboxUrl,
        CATALOG_PATH: catalogPath,
        LOG_LEVEL: 'warn',
        BATCH_CHUNK_SIZE: shape.chunkSize,
      };
      let worker = startProcess('worker-1', process.execPath, [bin, 'worker'], workerEnv);
      try {
        const r = await call(`${api.url}/api/v1/batches`, {
          key: tenant.inferenceKey,
          body: { endpoint: '/v1/chat/completions', model: 'test/batch-slow', requests: Array.from({ length: 60 }, (_, i) => chatLine(i)) },
        });
        expect(r.status).to.equal(202);
        // Let some lines finish (a worker process may take seconds to start on a loaded machine), then kill it without warning.
        for (let i = 0; i < 600; i++) {
          const b = await call(`${api.url}/api/v1/batches/${r.body.id}`, { key: tenant.inferenceKey });
          if (b.body.request_counts.completed >= 8) break;
          await new Promise((res) => setTimeout(res, 100));
        }
        const before = (await call(`${api.url}/api/v1/batches/${r.body.id}`, { key: tenant.inferenceKey })).body;
        expect(before.status).to.equal('in_progress');
        await worker.kill();
        expect(before.request_counts.completed).to.be.within(8, 59);
        worker = startProcess('worker-2', process.execPath, [bin, 'worker'], workerEnv);
        const done = await waitForStatus(api.url, tenant.inferenceKey, r.body.id, ['completed', 'failed'], 90_000);
        expect(done.status).to.equal('completed');
        expect(done.request_counts).to.deep.equal({ total: 60, completed: 60, failed: 0 });
        const customIds = done.results.map((x: any) => x.custom_id);
        expect(new Set(customIds).size).to.equal(60);
        expect(customIds).to.have.length(60);
        expect(await api.store.usage.countDocuments({ batch_id: r.body.id })).to.equal(60); // each line debited once
        await withTemporal(async (client) => {
          const history = await client.workflow.getHandle(r.body.id).fetchHistory();
          const timeouts = (history.events ?? []).flatMap((e) => {
            const a = e.activityTaskScheduledEventAttributes;
            return a?.activityType?.name === shape.activity ? [Number(a.heartbeatTimeout?.seconds)] : [];
          });
          expect(timeouts.length).to.be.greaterThan(0);
          expect(new Set(timeouts)).to.deep.equal(new Set([3]));
        });
      } finally {
        await worker.stop();
        await api.stop();
      }
    });
  }
});
