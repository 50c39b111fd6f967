// Workspaces, keys, credits and the usage ledger: isolation, hashing, exactly-once debit, the CLI,
// session precedence and the OpenAPI document.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import http from 'node:http';
import path from 'node:path';
import type { AddressInfo } from 'node:net';
import Koa from 'koa';
import { Validator } from '@seriousme/openapi-schema-validator';
import { requestContext } from '../api/request-context';
import { errorMiddleware } from '../api/errors';
import { jsonBody } from '../api/body';
import { requestMeta } from '../api/request-meta';
import { getBalance } from '../domain/accounts/credits';
import { UsageLedger, type UsageRecord } from '../domain/accounts/usage-ledger';
import { createLogger } from '../infrastructure/log';
import { stack } from './fixture';
import { call, createTenant, startTestGateway, uniqueName, type Tenant, type TestGateway, storedRecord } from './helpers';

function usage(t: Tenant, id: string, cost: number): UsageRecord {
  return {
    _id: id,
    workspace_id: t.workspaceId,
    key_id: t.inferenceKeyId,
    kind: 'decision',
    model: 'typesafe/jev-1.13',
    provider: 'sandbox',
    input_tokens: 120,
    output_tokens: 3,
    cost,
    session_id: 's-1',
    user: 'u-1',
    trace: { trace_id: 't-1' },
    app: { referer: 'https://app.example', title: 'My App', categories: ['cli'] },
    batch_id: null,
  };
}

describe('workspaces, keys and credits', () => {
  let gw: TestGateway;
  let a: Tenant;
  let b: Tenant;

  before(async () => {
    gw = await startTestGateway({ withWorker: false });
    [a, b] = await Promise.all([createTenant(gw.store, 5), createTenant(gw.store, 5)]);
  });
  after(async () => {
    await gw.stop();
  });

  it('stores only a hash of each key', async () => {
    const doc = await gw.store.apiKeys.findOne({ id: a.inferenceKeyId });
    expect(doc!._id).to.equal(createHash('sha256').update(a.inferenceKey).digest('hex'));
    const everything = JSON.stringify(await gw.store.apiKeys.find({}).toArray());
    expect(everything).to.not.include(a.inferenceKey.slice('sk-gw-v1-'.length));
    expect(doc!.label).to.match(/^sk-gw-v1-[0-9a-f]{6}…[0-9a-f]{4}$/);
  });

  it('shows a created key once: the create response has it, reads never do', async () => {
    const created = await call(`${gw.url}/api/v1/keys`, { key: a.managementKey, body: { name: 'ci', kind: 'inference' } });
    expect(created.status).to.equal(201);
    expect(created.body.key).to.match(/^sk-gw-v1-[0-9a-f]{64}$/);
    expect(created.body.data).to.include({ workspace_id: a.workspaceId, kind: 'inference', name: 'ci', revoked_at: null });
    const listed = await call(`${gw.url}/api/v1/keys`, { key: a.managementKey });
    expect(JSON.stringify(listed.body)).to.not.include(created.body.key);
    const one = await call(`${gw.url}/api/v1/keys/${created.body.data.id}`, { key: a.managementKey });
    expect(one.body.data).to.deep.equal(created.body.data);
  });

  it('lists keys a page at a time, in creation order, revoked ones included; after continues where a page ended', async () => {
    const t = await createTenant(gw.store, 5);
    const made: string[] = [];
    for (let i = 0; i < 7; i++) {
      const created = await call(`${gw.url}/api/v1/keys`, { key: t.managementKey, body: { name: `page-${i}` } });
      made.push(created.body.data.id);
    }
    await call(`${gw.url}/api/v1/keys/${made[3]}`, { method: 'DELETE', key: t.managementKey });
    const seen: any[] = [];
    const pages: number[] = [];
    let after = '';
    for (;;) {
      const page = await call(`${gw.url}/api/v1/keys?limit=3${after ? `&after=${after}` : ''}`, { key: t.managementKey });
      expect(page.status, JSON.stringify(page.body)).to.equal(200);
      expect(page.body.object).to.equal('list');
      expect(page.body.first_id).to.equal(page.body.data[0]?.id ?? null);
      expect(page.body.last_id).to.equal(page.body.data.at(-1)?.id ?? null);
      seen.push(...page.body.data);
      pages.push(page.body.data.length);
      if (!page.body.has_more) break;
      after = page.body.last_id;
    }
    // The tenant's own two keys, then the seven made here, each once, oldest first.
    expect(pages).to.deep.equal([3, 3, 3]);
    expect(seen.map((k) => k.id)).to.deep.equal([t.managementKeyId, t.inferenceKeyId, ...made]);
    expect(seen.map((k) => k.created_at)).to.deep.equal(seen.map((k) => k.created_at).sort());
    expect(seen.find((k) => k.id === made[3]).revoked_at).to.be.a('string');
    expect(seen.every((k) => k.workspace_id === t.workspaceId)).to.equal(true);
    // Without a limit, a page of up to 100.
    const whole = await call(`${gw.url}/api/v1/keys`, { key: t.managementKey });
    expect(whole.body.data).to.have.length(9);
    expect(whole.body.has_more).to.equal(false);
    for (const bad of ['limit=0', 'limit=101', 'limit=x', 'after=key_nothex', 'after=batch_1', 'other=1']) {
      const r = await call(`${gw.url}/api/v1/keys?${bad}`, { key: t.managementKey });
      expect(r.status, bad).to.equal(400);
      expect(r.body.error.code, bad).to.equal(400);
    }
  });

  it("never shows one workspace another's keys or generations: 404, not 403", async () => {
    const listed = await call(`${gw.url}/api/v1/keys`, { key: a.managementKey });
    expect(listed.body.data.map((k: { workspace_id: string }) => k.workspace_id)).to.satisfy((ids: string[]) =>
      ids.every((id) => id === a.workspaceId),
    );
    expect(listed.body.data.map((k: { id: string }) => k.id)).to.not.include(b.inferenceKeyId);

    const read = await call(`${gw.url}/api/v1/keys/${b.inferenceKeyId}`, { key: a.managementKey });
    expect(read.status).to.equal(404);
    const revoke = await call(`${gw.url}/api/v1/keys/${b.inferenceKeyId}`, { method: 'DELETE', key: a.managementKey });
    expect(revoke.status).to.equal(404);
    expect((await call(`${gw.url}/api/v1/credits`, { key: b.inferenceKey })).status).to.equal(200); // still live

    await new UsageLedger(gw.store).record(usage(b, `gen-${uniqueName('b')}`, 0.5));
    const genId = (await gw.store.usage.findOne({ workspace_id: b.workspaceId }))!._id;
    expect((await call(`${gw.url}/api/v1/generation?id=${genId}`, { key: a.inferenceKey })).status).to.equal(404);
    const own = await call(`${gw.url}/api/v1/generation?id=${genId}`, { key: b.inferenceKey });
    expect(own.status).to.equal(200);
    expect(own.body.data).to.include({
      id: genId,
      model: 'typesafe/jev-1.13',
      provider_name: 'sandbox',
      tokens_prompt: 120,
      tokens_completion: 3,
      total_cost: 0.5,
      session_id: 's-1',
      user: 'u-1',
      app_title: 'My App',
      app_referer: 'https://app.example',
    });
    // Credits of one workspace are untouched by the other's usage.
    expect((await call(`${gw.url}/api/v1/credits`, { key: a.inferenceKey })).body.data).to.deep.equal({
      total_credits: 5,
      total_usage: 0,
      balance: 5,
    });
  });

  it('a generation without attribution reads back as nulls, and its record stores none of those fields', async () => {
    const id = `gen-${uniqueName('bare')}`;
    const bare: UsageRecord = {
      ...usage(a, id, 0),
      session_id: null,
      user: null,
      trace: null,
      app: { referer: null, title: null, categories: [] },
    };
    await new UsageLedger(gw.store).record(bare);
    const stored = await storedRecord(gw.store, id);
    expect(stored).to.not.equal(null);
    for (const field of ['session_id', 'user', 'trace', 'app', 'batch_id']) expect(stored, field).to.not.have.property(field);
    const read = await call(`${gw.url}/api/v1/generation?id=${id}`, { key: a.inferenceKey });
    expect(read.status).to.equal(200);
    expect(read.body.data).to.include({ id, session_id: null, user: null, app_title: null, app_referer: null, batch_id: null });
    // Some attribution is kept whole: an app with only categories set.
    const tagged = `gen-${uniqueName('tagged')}`;
    await new UsageLedger(gw.store).record({ ...bare, _id: tagged, app: { referer: null, title: null, categories: ['cli'] } });
    expect((await storedRecord(gw.store, tagged))!.app).to.deep.equal({ referer: null, title: null, categories: ['cli'] });
  });

  it('a generation is stored packed (its id, workspace and one JSON text), and one stored by an earlier version still reads', async () => {
    const id = `gen-${uniqueName('packed')}`;
    await new UsageLedger(gw.store).record(usage(a, id, 0.25));
    const raw = await gw.store.usage.findOne({ _id: id });
    expect(Object.keys(raw!)).to.deep.equal(['_id', 'workspace_id', 'record']);
    const read = async (gen: string) => (await call(`${gw.url}/api/v1/generation?id=${gen}`, { key: a.inferenceKey })).body.data;
    const current = await read(id);
    expect(current).to.include({
      id,
      model: 'typesafe/jev-1.13',
      provider_name: 'sandbox',
      tokens_prompt: 120,
      total_cost: 0.25,
      app_title: 'My App',
    });

    // Written before records were packed: every field at the top, details as an object.
    const earlier = `gen-${uniqueName('earlier')}`;
    const createdAt = new Date('2026-11-20T10:00:00.000Z');
    const { trace: _trace, ...fields } = usage(a, earlier, 0.125);
    await gw.store.usage.insertOne({
      ...fields,
      trace: null,
      batch_id: null,
      details: { stream: false },
      created_at: createdAt,
      writer: 'w-old',
      group: 1,
    });
    expect(await read(earlier)).to.deep.equal({ ...current, id: earlier, total_cost: 0.125, created_at: createdAt.toISOString() });
  });

  it('debits a retried call exactly once, even when the retries race', async () => {
    const t = await createTenant(gw.store, 2);
    const id = `gen-${uniqueName('retry')}`;
    // Retries in one writer's group and in other writers (processes) at once.
    const ledger = new UsageLedger(gw.store);
    const results = await Promise.all(
      Array.from({ length: 8 }, (_, i) => (i % 2 ? ledger : new UsageLedger(gw.store)).record(usage(t, id, 0.25))),
    );
    expect(results.filter(Boolean)).to.have.length(1);
    expect(await ledger.record(usage(t, id, 0.25))).to.equal(false);
    expect(await gw.store.usage.countDocuments({ _id: id })).to.equal(1);
    expect(await getBalance(gw.store, t.workspaceId)).to.deep.equal({ total_credits: 2, total_usage: 0.25, balance: 1.75 });
    const credits = await call(`${gw.url}/api/v1/credits`, { key: t.inferenceKey });
    expect(credits.body.data).to.deep.equal({ total_credits: 2, total_usage: 0.25, balance: 1.75 });
    const key = await call(`${gw.url}/api/v1/key`, { key: t.inferenceKey });
    expect(key.body.data).to.include({ usage: 0.25, kind: 'inference', workspace_id: t.workspaceId, id: t.inferenceKeyId });
    const stored = await gw.store.apiKeys.findOne({ id: t.inferenceKeyId });
    expect(key.body.data).to.include({ name: stored!.name, label: stored!.label });
    expect(key.body.data.label).to.match(/^sk-gw-v1-[0-9a-f]{6}…[0-9a-f]{4}$/);
    expect(key.body.data.rate_limit).to.deep.equal({ requests: 600, interval: '60s' });
    expect(key.body.data.workspace_rate_limit).to.deep.equal({ requests: 6000, interval: '60s' });
  });
});

describe('gateway CLI: workspaces, keys, credits', () => {
  let gw: TestGateway;
  const bin = path.resolve(__dirname, '..', '..', 'bin', 'gateway.js');
  let env: NodeJS.ProcessEnv;
  const cli = (...args: string[]) => {
    const r = spawnSync(process.execPath, [bin, ...args], { encoding: 'utf8', env });
    return { status: r.status, out: r.stdout, err: r.stderr, json: () => JSON.parse(r.stdout) };
  };

  before(async () => {
    gw = await startTestGateway({ withWorker: false, env: { KEY_CACHE_MS: '400' } });
    env = { ...process.env, MONGODB_URI: stack.mongoUri, MONGODB_DATABASE: gw.config.mongo.database, LOG_LEVEL: 'silent' };
  });
  after(async () => {
    await gw.stop();
  });

  it('creates a workspace with credits and keys that work against the API, then revokes one', async () => {
    const name = uniqueName('acme');
    const ws = cli('workspaces', 'create', '--name', name, '--credits', '10', '--json');
    expect(ws.status, ws.err).to.equal(0);
    expect(ws.json()).to.include({ name, credits: 10 });

    const dup = cli('workspaces', 'create', '--name', name);
    expect(dup.status).to.equal(1);
    expect(dup.err).to.include('already exists');

    const mk = cli('keys', 'create', '--workspace', name, '--management', '--name', 'ops', '--json').json();
    expect(mk).to.have.keys('key', 'id', 'workspace_id', 'kind');
    expect(mk).to.include({ workspace_id: ws.json().id, kind: 'management' });
    const ik = cli('keys', 'create', '--workspace', ws.json().id, '--json').json();
    expect(ik.kind).to.equal('inference');

    expect((await call(`${gw.url}/api/v1/keys`, { key: mk.key })).status).to.equal(200);
    expect((await call(`${gw.url}/api/v1/keys`, { key: ik.key })).status).to.equal(403);

    const listed = cli('keys', 'list', '--workspace', name, '--json').json();
    expect(listed.map((k: { id: string }) => k.id)).to.have.members([mk.id, ik.id]);

    const added = cli('credits', 'add', '--workspace', name, '--amount', '2.5', '--json').json();
    expect(added).to.include({ added: 2.5, balance: 12.5 });
    expect((await call(`${gw.url}/api/v1/credits`, { key: ik.key })).body.data.balance).to.equal(12.5);

    expect(cli('keys', 'revoke', ik.id, '--json').json().revoked_at).to.be.a('string');
    // The gateway trusted the key it had just authenticated; another process's revocation applies
    // once that trust (KEY_CACHE_MS) runs out.
    const revokedAt = Date.now();
    let status = 200;
    while (status === 200 && Date.now() - revokedAt < 3_000) {
      status = (await call(`${gw.url}/api/v1/credits`, { key: ik.key })).status;
      if (status === 200) await new Promise((r) => setTimeout(r, 50));
    }
    expect(status).to.equal(401);
    expect(Date.now() - revokedAt).to.be.below(1_500);
  });

  it('creates a workspace with --credits 0: it answers 402 until credits are added', async () => {
    const name = uniqueName('zero');
    const ws = cli('workspaces', 'create', '--name', name, '--credits', '0', '--json');
    expect(ws.status, ws.err).to.equal(0);
    expect(ws.json()).to.include({ name, credits: 0 });
    const ik = cli('keys', 'create', '--workspace', name, '--json').json();
    const r = await call(`${gw.url}/api/v1/systemone`, {
      key: ik.key,
      body: { model: 'jev-1.13', state: 'x', questions: { q: { type: 'noul', instructions: 'ok?' } } },
    });
    expect(r.status).to.equal(402);
    expect(cli('workspaces', 'create', '--name', uniqueName('neg'), '--credits', '-1').err).to.include('non-negative number');
  });

  it('refuses bad input with a clear message', () => {
    expect(cli('credits', 'add', '--workspace', 'nope', '--amount', '-3').err).to.include('positive number');
    expect(cli('keys', 'create', '--workspace', 'no-such-workspace').err).to.include('Workspace "no-such-workspace" not found');
    expect(cli('keys', 'revoke', 'key_doesnotexist').err).to.include('not found');
  });
});

describe('session and attribution context', () => {
  let server: http.Server;
  let url: string;

  before(async () => {
    const app = new Koa();
    app.silent = true;
    app.use(requestContext(createLogger('silent')));
    app.use(errorMiddleware());
    app.use(jsonBody({ limitBytes: 1024 * 1024, maxDepth: 64, idleMs: 5000 }));
    app.use((ctx) => {
      ctx.body = requestMeta(ctx, ctx.request.body as object);
    });
    server = http.createServer(app.callback()).listen(0, '127.0.0.1');
    await new Promise((r) => server.once('listening', r));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  after(() => {
    server.close();
  });

  it('uses x-session-id when the body has none, and the body when both are given', async () => {
    expect((await call(url, { body: {}, headers: { 'x-session-id': 'from-header' } })).body.session_id).to.equal('from-header');
    expect((await call(url, { body: { session_id: 'from-body' }, headers: { 'x-session-id': 'from-header' } })).body.session_id).to.equal(
      'from-body',
    );
    expect((await call(url, { body: {} })).body.session_id).to.equal(null);
  });

  it('rejects an x-session-id over 256 characters with 400', async () => {
    const r = await call(url, { body: {}, headers: { 'x-session-id': 's'.repeat(257) } });
    expect(r.status).to.equal(400);
    expect(r.body.error.message).to.equal('x-session-id: must NOT have more than 256 characters');
    expect((await call(url, { body: {}, headers: { 'x-session-id': 's'.repeat(256) } })).status).to.equal(200);
  });

  it('reads app attribution from HTTP-Referer, X-OpenRouter-Title (or X-Title) and X-OpenRouter-Categories', async () => {
    const r = await call(url, {
      body: { user: 'u-9', trace: { trace_id: 'x', custom: 1 } },
      headers: { 'http-referer': 'https://a.example', 'x-title': 'Alias Title', 'x-openrouter-categories': 'cli, agents' },
    });
    expect(r.body).to.deep.equal({
      session_id: null,
      user: 'u-9',
      trace: { trace_id: 'x', custom: 1 },
      app: { referer: 'https://a.example', title: 'Alias Title', categories: ['cli', 'agents'] },
    });
    const both = await call(url, { body: {}, headers: { 'x-openrouter-title': 'Main', 'x-title': 'Alias' } });
    expect(both.body.app.title).to.equal('Main');
  });
});

describe('GET /api/v1/openapi.json', () => {
  let gw: TestGateway;
  before(async () => {
    gw = await startTestGateway({ withWorker: false });
  });
  after(async () => {
    await gw.stop();
  });

  it('is served without auth and validates as OpenAPI 3.1', async () => {
    const r = await call(`${gw.url}/api/v1/openapi.json`);
    expect(r.status).to.equal(200);
    expect(r.body.openapi).to.equal('3.1.0');
    const result = await new Validator().validate(r.body);
    expect(result.valid, JSON.stringify(result.errors)).to.equal(true);
    expect(r.body.paths).to.include.keys('/keys', '/keys/{id}', '/credits', '/key', '/generation');
    expect(r.body.paths['/keys'].post.requestBody.content['application/json'].schema.properties.kind.enum).to.deep.equal([
      'inference',
      'management',
    ]);
    expect(r.body.paths['/keys'].get.responses['403'].content['application/json'].schema.$ref).to.equal(
      '#/components/schemas/ErrorEnvelope',
    );
  });

  it('is serialised once, not for every request (it is 148 KB, and needs no key)', async () => {
    await call(`${gw.url}/api/v1/openapi.json`);
    const stringify = JSON.stringify;
    let large = 0;
    JSON.stringify = function (...args: Parameters<typeof stringify>) {
      const text = stringify.apply(JSON, args);
      if (text && text.length > 100_000) large++;
      return text;
    } as typeof stringify;
    let r: Awaited<ReturnType<typeof fetch>>;
    try {
      r = await fetch(`${gw.url}/api/v1/openapi.json`);
    } finally {
      JSON.stringify = stringify;
    }
    expect(large).to.equal(0);
    expect(r.headers.get('content-type')).to.equal('application/json; charset=utf-8');
    const text = await r.text();
    expect(Number(r.headers.get('content-length')))
      .to.equal(Buffer.byteLength(text))
      .and.be.greaterThan(100_000);
    expect(JSON.parse(text).openapi).to.equal('3.1.0');
  });
});
