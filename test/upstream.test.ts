// Provider adapters, fallbacks and failure statuses through real HTTP to the sandbox provider
// (its own process), with faults injected by the catalog's base URLs.
import { expect } from 'chai';
import { Catalog, type Endpoint } from '../domain/catalog';
import { Store } from '../infrastructure/store';
import { LiveStats } from '../domain/routing/stats';
import { createUpstreams, invoke, type InvokeRequest, type Upstreams } from '../domain/routing/upstreams';
import { loadConfig } from '../infrastructure/config';
import { GatewayError } from '../infrastructure/errors';
import { stack } from './fixture';
import { call, createTenant, startTestGateway, uniqueName } from './helpers';

const run = uniqueName('run'); // isolates this run's fail_first counters in the sandbox
const p = (slug: string, faults: string, extra: Record<string, unknown> = {}) => ({
  slug,
  name: slug,
  adapter: 'openai',
  base_url: `\${SANDBOX_URL}/~run=${run}${faults ? `,${faults}` : ''}/openai/v1`,
  collects_data: false,
  zdr: false,
  max_concurrency: 50,
  timeout_ms: 5000,
  ...extra,
});
const e = (provider: string, prompt: number, extra: Record<string, unknown> = {}) => ({
  provider,
  upstream_model: `${provider}-model`,
  pricing: { prompt, completion: prompt * 4 },
  quantization: 'bf16',
  supported_parameters: ['temperature', 'max_tokens'],
  ...extra,
});

// Built once the fixture has started the sandbox and knows its URL.
const buildCatalog = () =>
  Catalog.fromObject(
    {
      providers: [
        p('cheap', '', { collects_data: true, accepted_options: ['seed'] }),
        p('pricey', ''),
        p('broken', 'status=500'),
        p('slow', 'timeout', { timeout_ms: 300 }),
        p('busy', 'overloaded'),
        p('limited', 'status=429,retry_after=30'),
        p('flaky', 'status=429,retry_after=1,fail_first=1'),
        p('single', 'latency=300', { max_concurrency: 1 }),
        { ...p('claude', ''), adapter: 'anthropic', base_url: `\${SANDBOX_URL}/anthropic` },
        { ...p('s1', ''), adapter: 'systemone', base_url: `\${SANDBOX_URL}/systemone` },
      ],
      models: [
        {
          id: 't/chat',
          name: 'chat',
          kind: 'chat',
          family: 't/chat',
          version: '1',
          released: '20260101',
          context_length: 1000,
          distillable: true,
          endpoints: ['cheap', 'pricey', 'broken', 'slow', 'busy', 'limited', 'flaky', 'single', 'claude'].map((s, i) =>
            e(s, s === 'cheap' ? 0.1 : 1 + i),
          ),
        },
        {
          id: 't/embed',
          name: 'e',
          kind: 'embedding',
          family: 't/embed',
          version: '1',
          released: '20260101',
          context_length: 1000,
          distillable: true,
          endpoints: [e('cheap', 0.02)],
        },
        {
          id: 't/decide',
          name: 'd',
          kind: 'decision',
          family: 't/decide',
          version: '1',
          released: '20260101',
          context_length: 1000,
          distillable: true,
          endpoints: [e('s1', 0.5, { pricing: { prompt: 0.5, completion: 2, request: 0.001 } })],
        },
      ],
    },
    { SANDBOX_URL: stack.sandboxUrl },
  );
let catalog: Catalog;

const chatBody = { messages: [{ role: 'user', content: 'Say something about gateways.' }], max_tokens: 8 };

describe('provider adapters and execution against the sandbox', () => {
  let store: Store;
  let up: Upstreams & { close(): Promise<void> };
  const go = (req: Partial<InvokeRequest>) => invoke(up, { models: [catalog.models[0]], operation: 'chat', body: chatBody, ...req });
  const failure = async (req: Partial<InvokeRequest>): Promise<GatewayError> => {
    try {
      await go(req);
    } catch (err) {
      return err as GatewayError;
    }
    throw new Error('expected a failure');
  };

  before(async () => {
    catalog = buildCatalog();
    store = await Store.connect(stack.mongoUri, uniqueName('upstream').replace(/-/g, '_'));
    up = createUpstreams(loadConfig({ SANDBOX_URL: stack.sandboxUrl }), store, catalog);
  });
  after(async () => {
    await up.close();
    await store.close();
  });

  it('calls an OpenAI-compatible chat endpoint and prices the usage', async () => {
    const r = await go({ preferences: { only: ['cheap'] } });
    expect(r.endpoint.tag).to.equal('cheap');
    expect(r.body.object).to.equal('chat.completion');
    expect(r.body.model).to.equal('cheap-model'); // the upstream id replaced ours
    expect(r.usage.input_tokens).to.equal(r.body.usage.prompt_tokens).and.be.greaterThan(0);
    expect(r.usage.output_tokens).to.equal(r.body.usage.completion_tokens).and.be.greaterThan(0);
    expect(r.cost).to.be.closeTo((r.usage.input_tokens * 0.1 + r.usage.output_tokens * 0.4) / 1e6, 1e-12);
  });

  it('answers the same request the same way (the sandbox is deterministic)', async () => {
    const [a, b] = await Promise.all([go({ preferences: { only: ['cheap'] } }), go({ preferences: { only: ['cheap'] } })]);
    expect(a.body).to.deep.equal(b.body);
  });

  it('speaks responses, embeddings, Anthropic messages and System One', async () => {
    const responses = await go({
      operation: 'responses',
      body: { input: 'hello there', max_output_tokens: 5 },
      preferences: { only: ['pricey'] },
    });
    expect(responses.body.object).to.equal('response');
    expect(responses.usage).to.deep.equal({
      input_tokens: responses.body.usage.input_tokens,
      output_tokens: responses.body.usage.output_tokens,
    });

    const emb = await invoke(up, { models: [catalog.models[1]], operation: 'embeddings', body: { input: ['a', 'bb'], dimensions: 8 } });
    expect(emb.body.data).to.have.length(2);
    expect(emb.body.data[0].embedding).to.have.length(8);
    expect(emb.usage).to.deep.equal({ input_tokens: 2, output_tokens: 0 });
    expect(emb.cost).to.be.closeTo((2 * 0.02) / 1e6, 1e-15);

    const msg = await go({
      operation: 'messages',
      body: { max_tokens: 6, messages: [{ role: 'user', content: 'hi' }] },
      preferences: { only: ['claude'] },
    });
    expect(msg.endpoint.tag).to.equal('claude');
    expect(msg.body.type).to.equal('message');
    expect(msg.usage.output_tokens).to.equal(msg.body.usage.output_tokens);

    const s1 = await invoke(up, {
      models: [catalog.models[2]],
      operation: 'systemone',
      body: { state: 'x', questions: { q: { type: 'noul', instructions: 'is it?' } } },
    });
    expect(s1.body.answers.q.type).to.equal('noul');
    expect(s1.cost).to.be.closeTo((s1.usage.input_tokens * 0.5 + s1.usage.output_tokens * 2) / 1e6 + 0.001, 1e-12);
  });

  it('falls back to the next provider on a 500', async () => {
    const r = await go({ preferences: { order: ['broken', 'cheap'] } });
    expect(r.endpoint.tag).to.equal('cheap');
    expect(r.attempts).to.deep.equal([
      { provider: 'broken', endpoint: 'broken', kind: 'http', status: 500, message: 'sandbox: injected status 500' },
    ]);
  });

  it('with allow_fallbacks false returns the upstream error as 502 naming the provider', async () => {
    const err = await failure({ preferences: { order: ['broken', 'cheap'], allow_fallbacks: false, only: ['broken'] } });
    expect(err.status).to.equal(502);
    expect(err.metadata).to.include({ provider_name: 'broken', upstream_status: 500, upstream_message: 'sandbox: injected status 500' });
    const primaryOnly = await failure({ preferences: { allow_fallbacks: false, sort: { by: 'price' }, ignore: ['cheap', 'pricey'] } });
    expect(primaryOnly.metadata!.attempts).to.have.length(1);
  });

  it('maps a provider timeout to 524, an overload to 529 and a final 429 to 429', async () => {
    expect((await failure({ preferences: { only: ['slow'] } })).status).to.equal(524);
    const busy = await failure({ preferences: { only: ['busy'] } });
    expect(busy.status).to.equal(529);
    expect(busy.metadata).to.include({ provider_name: 'busy', upstream_status: 529 });
    const limited = await failure({ preferences: { only: ['limited'] } });
    expect(limited.status).to.equal(429);
    expect((limited as unknown as { retryAfterSeconds: number }).retryAfterSeconds).to.equal(30);
  });

  it('falls back past a timeout, an overload and a 429 to a healthy provider', async () => {
    const r = await go({ preferences: { order: ['slow', 'busy', 'limited', 'pricey'] } });
    expect(r.endpoint.tag).to.equal('pricey');
    expect(r.attempts.map((a) => a.kind)).to.deep.equal(['timeout', 'overloaded', 'rate_limited']);
  });

  it('honours a short Retry-After when no other provider is left', async () => {
    const started = Date.now();
    const r = await go({ preferences: { only: ['flaky'] } });
    expect(r.endpoint.tag).to.equal('flaky');
    expect(Date.now() - started).to.be.at.least(950);
    expect(r.attempts.map((a) => a.status)).to.deep.equal([429]);
  });

  it('respects order, sort: price and data_collection: deny', async () => {
    expect((await go({ preferences: { order: ['pricey', 'cheap'] } })).endpoint.tag).to.equal('pricey');
    expect((await go({ preferences: { only: ['cheap', 'pricey'], sort: 'price' } })).endpoint.tag).to.equal('cheap');
    expect((await go({ preferences: { only: ['cheap', 'pricey'], data_collection: 'deny' } })).endpoint.tag).to.equal('pricey');
  });

  it("forwards only the chosen provider's accepted options", async () => {
    const r = await go({ preferences: { only: ['cheap'], options: { cheap: { seed: 7, not_a_real_option: 1 }, pricey: { seed: 1 } } } });
    // The sandbox's answer is a function of the exact body it received.
    const direct = await fetch(`${stack.sandboxUrl}/~run=${run}/openai/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ ...chatBody, model: 'cheap-model', seed: 7 }),
    });
    expect(r.body.id).to.equal(((await direct.json()) as { id: string }).id);
  });

  it('cancels an in-flight call through an AbortSignal', async () => {
    const controller = new AbortController();
    setTimeout(() => controller.abort(), 100);
    const err = await failure({ preferences: { only: ['slow'] }, signal: controller.signal });
    // Aborted, not timed out: the provider's own 300 ms timeout would be a 'timeout' attempt. (No
    // upper bound on the elapsed time: under load that would measure the machine, not the abort.)
    expect(err.metadata!.attempts).to.deep.equal([
      { provider: 'slow', endpoint: 'slow', kind: 'aborted', status: null, message: 'Request was cancelled' },
    ]);
  });

  it("keeps within a provider's concurrency limit: no capacity is 503", async () => {
    const results = await Promise.allSettled([
      go({ preferences: { only: ['single'] }, queueWaitMs: 50 }),
      go({ preferences: { only: ['single'] }, queueWaitMs: 50 }),
    ]);
    expect(results.map((r) => r.status).sort()).to.deep.equal(['fulfilled', 'rejected']);
    const rejected = results.find((r) => r.status === 'rejected') as PromiseRejectedResult;
    expect(rejected.reason.status).to.equal(503);
    // With a longer wait, the second call queues for the slot instead.
    const queued = await Promise.all([go({ preferences: { only: ['single'] } }), go({ preferences: { only: ['single'] } })]);
    expect(queued.map((r) => r.endpoint.tag)).to.deep.equal(['single', 'single']);
  });

  it('404 naming the preference when nothing is eligible', async () => {
    const err = await failure({ preferences: { only: ['cheap'], zdr: true } });
    expect(err.status).to.equal(404);
    expect(err.message).to.equal('No endpoint of t/chat satisfies provider.zdr');
  });
});

describe('live endpoint statistics', () => {
  it('are shared between processes through MongoDB and feed percentiles and outages', async () => {
    const store = await Store.connect(stack.mongoUri, uniqueName('stats').replace(/-/g, '_'));
    try {
      const a = new LiveStats(store);
      const b = new LiveStats(store);
      for (const ms of [100, 200, 300, 400]) a.record('m@p', { ok: true, latencyMs: ms, outputTokens: 10 });
      a.record('m@p', { ok: false, latencyMs: 0, outputTokens: 0 });
      expect(b.snapshot().get('m@p')).to.equal(undefined);
      await a.flush();
      // Stored as one text, not as lists FerretDB decodes value by value (3.2 ms of its CPU a summary).
      const [stored] = await store.endpointSamples.find({}).toArray();
      expect(stored.endpoints).to.be.a('string');
      await b.refresh();
      const s = b.snapshot().get('m@p')!;
      expect(s.latency).to.deep.equal({ p50: 0.2, p75: 0.3, p90: 0.4, p99: 0.4 });
      expect(s.throughput!.p50).to.be.closeTo(10 / 0.3, 0.005); // of 100, 50, 33.3 and 25 tokens/s, stored to 0.01
      expect(s).to.include({ requests: 4, failures: 1 });
      expect(Date.now() - s.lastFailureAt!).to.be.lessThan(5000);
    } finally {
      await store.close();
    }
  });

  it('keep what a failed write held, together with what was measured meanwhile', async () => {
    const store = await Store.connect(stack.mongoUri, uniqueName('stats').replace(/-/g, '_'));
    const s = new LiveStats(store);
    s.record('m@p', { ok: true, latencyMs: 100, outputTokens: 1 });
    await store.close(); // the write below fails
    const flushing = s.flush();
    s.record('m@p', { ok: true, latencyMs: 300, outputTokens: 1 });
    s.record('m@p', { ok: false, latencyMs: 0, outputTokens: 0 });
    await flushing;
    const stat = s.snapshot().get('m@p')!;
    expect(stat).to.include({ requests: 2, failures: 1 });
    expect(stat.latency).to.include({ p50: 0.1, p99: 0.3 });
  });

  it('are rebuilt when read from the store, not on the calls that route by them; a failure counts at once', async () => {
    const store = await Store.connect(stack.mongoUri, uniqueName('stats').replace(/-/g, '_'));
    try {
      const s = new LiveStats(store);
      s.record('m@p', { ok: true, latencyMs: 100, outputTokens: 1 });
      await s.flush();
      await s.refresh();
      expect(s.snapshot().get('m@p')).to.include({ requests: 1, failures: 0 });
      s.record('m@p', { ok: true, latencyMs: 300, outputTokens: 1 }); // waits for the next refresh
      s.record('m@p', { ok: false, latencyMs: 0, outputTokens: 0 });
      s.record('n@p', { ok: false, latencyMs: 0, outputTokens: 0 });
      const stat = s.snapshot().get('m@p')!;
      expect(stat).to.include({ requests: 1, failures: 1 });
      expect(stat.latency).to.include({ p50: 0.1, p99: 0.1 });
      expect(Date.now() - stat.lastFailureAt!).to.be.lessThan(5000);
      expect(s.snapshot().get('n@p')).to.deep.include({ requests: 0, failures: 1, latency: null });
      await s.flush();
      await s.refresh();
      // The failure is counted once, and the success measured since is in.
      expect(s.snapshot().get('m@p')).to.include({ requests: 2, failures: 1 });
      expect(s.snapshot().get('m@p')!.latency).to.include({ p99: 0.3 });
    } finally {
      await store.close();
    }
  });

  it('are read once: a refresh reads only what was written since the last (and a little before), counting each summary once', async () => {
    const store = await Store.connect(stack.mongoUri, uniqueName('stats').replace(/-/g, '_'), { monitorCommands: true });
    let read = 0;
    store.client.on('commandSucceeded', (e) => {
      if (e.commandName === 'find') read += (e.reply as { cursor: { firstBatch: unknown[] } }).cursor.firstBatch.length;
    });
    try {
      let now = Date.now();
      const s = new LiveStats(store, 5 * 60_000, () => now);
      const other = new LiveStats(store, 5 * 60_000, () => now);
      for (let i = 0; i < 10; i++) {
        other.record('m@p', { ok: true, latencyMs: 100, outputTokens: 1 });
        await other.flush();
        now += 2_000;
      }
      now += 60_000;
      read = 0;
      await s.refresh();
      expect(read).to.equal(10);
      expect(s.snapshot().get('m@p')).to.include({ requests: 10 });

      // A minute on, with two more summaries: only those are read, and the ten are still counted.
      now += 60_000;
      for (let i = 0; i < 2; i++) {
        other.record('m@p', { ok: true, latencyMs: 300, outputTokens: 1 });
        await other.flush();
      }
      read = 0;
      await s.refresh();
      expect(read).to.equal(2);
      expect(s.snapshot().get('m@p')).to.include({ requests: 12 });

      // A summary stamped before the last read but stored after it (a slow insert) is still read,
      // once; those read already are read again but not counted twice. (Written as a list, as
      // earlier versions wrote summaries: read too.)
      await store.endpointSamples.insertOne({
        _id: `${(now - 5_000).toString(36).padStart(9, '0')}:late:0`,
        at: new Date(now - 5_000),
        endpoints: [{ e: 'm@p', ok: 5, failed: 0, last_failure: null, ms: [200], tps: [] }],
      });
      now += 2_000;
      await s.refresh();
      const built = s.snapshot();
      await s.refresh();
      expect(s.snapshot().get('m@p')).to.include({ requests: 17 });
      // Nothing new: the snapshot is not rebuilt (sorting a busy window's samples every two seconds).
      expect(s.snapshot()).to.equal(built);
    } finally {
      await store.close();
    }
  });

  it('drop samples older than the window', async () => {
    const store = await Store.connect(stack.mongoUri, uniqueName('stats').replace(/-/g, '_'));
    try {
      let now = Date.now();
      const s = new LiveStats(store, 60_000, () => now);
      s.record('m@p', { ok: true, latencyMs: 100, outputTokens: 1 });
      await s.flush();
      now += 61_000;
      await s.refresh();
      expect(s.snapshot().get('m@p')).to.equal(undefined);
    } finally {
      await store.close();
    }
  });
});

describe('GET /api/v1/models and /models/{author}/{slug}/endpoints', () => {
  it('list the default catalog with prices, and endpoints with live stats', async function () {
    this.timeout(20_000);
    const gw = await startTestGateway({ withWorker: false });
    try {
      const t = await createTenant(gw.store);
      const models = await call(`${gw.url}/api/v1/models`, { key: t.inferenceKey });
      expect(models.status).to.equal(200);
      const jev = models.body.data.find((m: { id: string }) => m.id === 'typesafe/jev-1.13');
      expect(jev).to.include({ canonical_slug: 'typesafe/jev-1.13-20260917', kind: 'decision', context_length: 65536 });
      expect(jev.pricing).to.deep.equal({ prompt: '0.0000005', completion: '0.000002', request: '0' });

      // A measurement made by another process shows up once the gateway refreshes its snapshot.
      const other = new LiveStats(gw.store);
      other.record('sandbox/chat-1@sandbox-beta', { ok: true, latencyMs: 250, outputTokens: 50 });
      await other.flush();
      let beta: any;
      for (let i = 0; i < 40 && !beta?.latency_seconds; i++) {
        await new Promise((r) => setTimeout(r, 250));
        const res = await call(`${gw.url}/api/v1/models/sandbox/chat-1/endpoints`, { key: t.inferenceKey });
        beta = res.body.data.endpoints.find((x: { tag: string }) => x.tag === 'sandbox-beta');
      }
      expect(beta.latency_seconds).to.deep.equal({ p50: 0.25, p75: 0.25, p90: 0.25, p99: 0.25 });
      expect(beta).to.include({
        quantization: 'bf16',
        data_collection: 'deny',
        zdr: true,
        uptime: 1,
        recent_outage: false,
        max_concurrency_per_process: 100,
      });
      const res = await call(`${gw.url}/api/v1/models/sandbox/chat-1/endpoints`, { key: t.inferenceKey });
      expect(res.body.data.endpoints.map((x: Endpoint) => x.tag)).to.have.members([
        'sandbox-alpha',
        'sandbox-alpha/turbo',
        'sandbox-beta',
        'sandbox-claude',
      ]);
      const missing = await call(`${gw.url}/api/v1/models/nobody/nothing/endpoints`, { key: t.inferenceKey });
      expect(missing.status).to.equal(404);
      expect(missing.body.error.message).to.equal('Model "nobody/nothing" not found');
    } finally {
      await gw.stop();
    }
  });
});
