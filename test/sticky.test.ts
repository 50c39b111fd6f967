// Sticky sessions end to end: calls that share a session id, spread over two API processes, reach
// one endpoint; when it fails they move together to one other; decisions and batch lines stick too.
import http from 'node:http';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import { expect } from 'chai';
import { Agent, request } from 'undici';
import { endpointEntry, modelEntry, providerEntry } from '../domain/catalog/entries';
import { Store } from '../infrastructure/store';
import type { ManagedProcess } from '../devstack/processes';
import { stack } from './fixture';
import {
  allApiProcessesUp,
  call,
  createTenant,
  startGatewayProcess,
  uniqueName,
  waitForStatus,
  writeTestCatalog,
  type Tenant,
  storedUsage,
} from './helpers';

const SLUGS = ['st-a', 'st-b', 'st-c', 'st-d'];

/**
 * The providers' way to the sandbox, through a proxy the test can break: `/<slug>/…` is forwarded
 * to the sandbox unless that provider is down (500). Counts the calls each provider answered.
 */
async function switchableProxy(sandboxUrl: string) {
  const down = new Set<string>();
  const served = new Map<string, number>();
  const server = http.createServer(async (req, res) => {
    const [, slug, ...rest] = (req.url ?? '/').split('/');
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    if (down.has(slug)) {
      res.writeHead(500, { 'content-type': 'application/json' }).end(JSON.stringify({ error: { message: `${slug} is down` } }));
      return;
    }
    const upstream = await fetch(`${sandboxUrl}/${rest.join('/')}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: Buffer.concat(chunks),
    });
    served.set(slug, (served.get(slug) ?? 0) + 1);
    res.writeHead(upstream.status, { 'content-type': upstream.headers.get('content-type') ?? 'application/json' });
    res.end(Buffer.from(await upstream.arrayBuffer()));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    down,
    served,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

// Two API processes either way: two gateways on two ports, or one gateway whose two processes share
// its port (API_PROCESSES=2; concurrent connections are dealt to both).
const LAYOUTS = [
  { name: 'two gateways on two ports', gateways: 2, processes: '1' },
  { name: 'one gateway of two API processes sharing its port', gateways: 1, processes: '2' },
];

for (const layout of LAYOUTS)
  describe(`sticky sessions across API processes: ${layout.name}`, function () {
    this.timeout(120_000);
    let proxy: Awaited<ReturnType<typeof switchableProxy>>;
    let store: Store;
    let t: Tenant;
    const procs: ManagedProcess[] = [];
    /** Where call n goes: apis[n % 2]. */
    const apis: { url: string }[] = [];

    before(async () => {
      proxy = await switchableProxy(stack.sandboxUrl);
      const catalog = writeTestCatalog('sticky', (c) => {
        c.providers.push(...SLUGS.map((slug) => providerEntry(slug, `${proxy.url}/${slug}/openai/v1`)));
        // Equal prices: each endpoint is as likely a session's first choice.
        c.models.push(
          modelEntry(
            'sticky/chat',
            SLUGS.map((slug) => endpointEntry(slug, 1, { upstream_model: 'sandbox-chat-small' })),
          ),
          modelEntry(
            'sticky/decide',
            SLUGS.map((slug) =>
              endpointEntry(slug, 1, { upstream_model: 'sandbox-chat-small', supported_parameters: ['logprobs', 'top_logprobs'] }),
            ),
            { kind: 'decision' },
          ),
        );
      });
      const database = uniqueName('sticky').replace(/-/g, '_');
      store = await Store.connect(stack.mongoUri, database);
      t = await createTenant(store, 100);
      const taskQueue = uniqueName('sticky-tq');
      for (const name of ['sticky-api-1', 'sticky-api-2'].slice(0, layout.gateways)) {
        const api = await startGatewayProcess(name, ['api', '--with-worker'], {
          API_PROCESSES: layout.processes,
          CATALOG_PATH: catalog,
          MONGODB_URI: stack.mongoUri,
          MONGODB_DATABASE: database,
          TEMPORAL_ADDRESS: stack.temporalAddress,
          TEMPORAL_TASK_QUEUE: taskQueue,
          SANDBOX_URL: stack.sandboxUrl,
          DATA_DIR: path.join(stack.tmpDir, uniqueName(name)),
          RATE_LIMIT_REQUESTS: '100000',
        });
        procs.push(api.proc);
        if (layout.processes !== '1') await allApiProcessesUp(api.url, Number(layout.processes));
        apis.push(api);
      }
      if (apis.length === 1) apis.push(apis[0]);
    });
    after(async () => {
      await Promise.all(procs.map((p) => p.stop()));
      await store?.close();
      await proxy?.close();
    });

    /**
     * 100 calls of one session, alternating between the two processes (a body session id, or the
     * header). Each call opens a connection of its own: with one shared port the kernel deals
     * connections, not calls, and a few kept-alive connections could all land on one process.
     */
    async function providersOf(session: string, calls = 100): Promise<string[]> {
      const providers: string[] = [];
      for (let i = 0; i < calls; i += 10) {
        const connections = new Agent({ pipelining: 0 });
        const batch = Array.from({ length: 10 }, async (_, j) => {
          const n = i + j;
          const body = { model: 'sticky/chat', messages: [{ role: 'user', content: `call ${n}` }], max_tokens: 5 };
          const r = await request(`${apis[n % 2].url}/api/v1/chat/completions`, {
            method: 'POST',
            dispatcher: connections,
            reset: true,
            headers: {
              authorization: `Bearer ${t.inferenceKey}`,
              'content-type': 'application/json',
              ...(n % 3 ? {} : { 'x-session-id': session }),
            },
            body: JSON.stringify(n % 3 ? { ...body, session_id: session } : body),
          });
          return { status: r.statusCode, body: (await r.body.json()) as any };
        });
        try {
          for (const r of await Promise.all(batch)) {
            expect(r.status, JSON.stringify(r.body)).to.equal(200);
            providers.push(r.body.provider);
          }
        } finally {
          await connections.close();
        }
      }
      return providers;
    }

    it('100 calls of one session hit one endpoint; after it fails they move together to one other', async () => {
      const before = new Set(await providersOf('conversation-1'));
      expect(before.size, [...before].join()).to.equal(1);
      const [first] = before;
      proxy.down.add(first);
      try {
        const after = new Set(await providersOf('conversation-1'));
        expect(after.size, [...after].join()).to.equal(1);
        expect([...after][0]).to.not.equal(first);
      } finally {
        proxy.down.delete(first);
      }
      if (layout.gateways === 1) {
        // Both processes of the one gateway answered some of those calls.
        const scrape = await (await fetch(`${apis[0].url}/metrics`)).text();
        for (const i of [0, 1]) {
          const served = Number(scrape.match(new RegExp(`gateway_api_process_requests\\{process="${i}"\\} (\\d+)`))?.[1]);
          expect(served, `process ${i}`).to.be.above(0);
        }
      }
    });

    it('different sessions spread over the endpoints', async () => {
      const firsts = new Set<string>();
      for (let s = 0; s < 16; s++) firsts.add((await providersOf(`spread-${s}`, 2))[0]);
      expect(firsts.size).to.be.at.least(2);
    });

    it("decisions and batch lines follow their session's endpoint", async () => {
      const session = 'conversation-2';
      // Decisions of one session, alternating between the processes: one endpoint.
      const decided = new Set<string>();
      for (let i = 0; i < 10; i++) {
        const decision = await call(`${apis[i % 2].url}/api/v1/systemone`, {
          key: t.inferenceKey,
          body: { model: 'sticky/decide', state: `x${i}`, questions: { q: { type: 'noul', instructions: 'ok?' } }, session_id: session },
        });
        expect(decision.status, JSON.stringify(decision.body)).to.equal(200);
        decided.add(decision.body.provider);
      }
      expect(decided.size, [...decided].join()).to.equal(1);

      // A batch's lines with the session of the chat calls, on the same model: the same endpoint.
      const [chatProvider] = await providersOf(session, 4);
      const requests = Array.from({ length: 6 }, (_, i) => ({
        custom_id: `l${i}`,
        body: { messages: [{ role: 'user', content: `line ${i}` }], max_tokens: 5, session_id: session },
      }));
      const created = await call(`${apis[0].url}/api/v1/batches`, {
        key: t.inferenceKey,
        body: { endpoint: '/v1/chat/completions', model: 'sticky/chat', requests },
      });
      expect(created.status, JSON.stringify(created.body)).to.equal(202);
      const done = await waitForStatus(apis[0].url, t.inferenceKey, created.body.id, ['completed']);
      expect(done.request_counts).to.include({ completed: 6, failed: 0 });
      const lines = await storedUsage(store, { batch_id: created.body.id });
      expect(lines.map((u) => u.provider)).to.deep.equal(Array(6).fill(chatProvider));
    });
  });
