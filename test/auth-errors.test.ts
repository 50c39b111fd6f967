// The common API contract: authentication matrix and the error envelope for every status this
// layer owns (400, 401, 402, 403, 404, 413, 429, 500).
import { expect } from 'chai';
import { MongoBulkWriteError } from 'mongodb';
import http from 'node:http';
import { randomBytes } from 'node:crypto';
import net, { type AddressInfo } from 'node:net';
import Koa from 'koa';
import Router from '@koa/router';
import { Type } from '@sinclair/typebox';
import { requestContext } from '../api/request-context';
import { errorMiddleware } from '../api/errors';
import { defineRoute, mountRoutes } from '../api/route';
import { RateLimiter } from '../domain/accounts/rate-limit';
import { KeptVersions } from '../domain/presets/kept-versions';
import { SpendAdmission } from '../domain/accounts/spend-admission';
import { KeyCache } from '../domain/accounts/key-cache';
import { Metrics } from '../infrastructure/metrics';
import { createLogger } from '../infrastructure/log';
import { UsageLedger } from '../domain/accounts/usage-ledger';
import { inlineExecution } from '../api/decision-execution';
import { decisionService } from '../domain/decisions/service';
import { decisionRoutes } from '../api/routes/decisions';
import { createUpstreams } from '../domain/routing/upstreams';
import type { AppDeps } from '../api/deps';
import { usageRecord, call, clearOfWindowEdge, createTenant, startTestGateway, storeWith, type Tenant, type TestGateway } from './helpers';
import { capturingLogger } from './capture-log';

const envelope = (code: number, message: string, metadata: unknown = null, userId: string | null = null) => ({
  error: { code, message, metadata },
  user_id: userId,
});

describe('authentication and the error envelope', () => {
  let gw: TestGateway;
  let t: Tenant;
  const { logger, lines } = capturingLogger('debug');

  before(async () => {
    gw = await startTestGateway({ withWorker: false, logger, env: { BODY_LIMIT: '1kb' } });
    t = await createTenant(gw.store);
  });
  after(async () => {
    await gw.stop();
  });

  it('401 with no Authorization header says the authentication header is missing', async () => {
    const r = await call(`${gw.url}/api/v1/credits`);
    expect(r.status).to.equal(401);
    expect(r.body).to.deep.equal(envelope(401, 'Missing Authentication header: send Authorization: Bearer <API key>'));
  });

  it('401 for a malformed header, an unknown key and a revoked key alike', async () => {
    expect((await call(`${gw.url}/api/v1/credits`, { headers: { authorization: `Basic ${t.inferenceKey}` } })).body).to.deep.equal(
      envelope(401, "Malformed Authorization header: expected 'Bearer <API key>'"),
    );
    const unknown = await call(`${gw.url}/api/v1/credits`, { key: `sk-gw-v1-${'0'.repeat(64)}` });
    expect(unknown.body).to.deep.equal(envelope(401, 'Invalid or revoked API key'));
    const garbage = await call(`${gw.url}/api/v1/credits`, { key: 'x'.repeat(5000) });
    expect(garbage.status).to.equal(401);

    const extra = await call(`${gw.url}/api/v1/keys`, { key: t.managementKey, body: { name: 'short-lived' } });
    expect(extra.status).to.equal(201);
    expect((await call(`${gw.url}/api/v1/credits`, { key: extra.body.key })).status).to.equal(200);
    const revoked = await call(`${gw.url}/api/v1/keys/${extra.body.data.id}`, { method: 'DELETE', key: t.managementKey });
    expect(revoked.status).to.equal(200);
    expect(revoked.body.data.revoked_at).to.be.a('string');
    expect((await call(`${gw.url}/api/v1/credits`, { key: extra.body.key })).body).to.deep.equal(
      envelope(401, 'Invalid or revoked API key'),
    );
  });

  it('403 when an inference key calls a management-only operation', async () => {
    for (const [method, path] of [
      ['GET', '/keys'],
      ['POST', '/keys'],
      ['GET', `/keys/${t.inferenceKeyId}`],
      ['DELETE', `/keys/${t.inferenceKeyId}`],
    ]) {
      const r = await call(`${gw.url}/api/v1${path}`, { method, key: t.inferenceKey, body: method === 'POST' ? {} : undefined });
      expect(r.status, `${method} ${path}`).to.equal(403);
      expect(r.body).to.deep.equal(envelope(403, 'Only management keys can perform this operation', null, t.inferenceKeyId));
    }
  });

  it('both kinds of key may use the inference-level routes', async () => {
    for (const key of [t.inferenceKey, t.managementKey]) {
      const r = await call(`${gw.url}/api/v1/key`, { key });
      expect(r.status).to.equal(200);
      expect(r.body.data.workspace_id).to.equal(t.workspaceId);
    }
  });

  it('400 for malformed JSON, for a non-JSON content type and for a missing body', async () => {
    const bad = await call(`${gw.url}/api/v1/keys`, { key: t.managementKey, body: '{"name": ' });
    expect(bad.body).to.deep.equal(envelope(400, 'Request body is not valid JSON', null, t.managementKeyId));
    const text = await call(`${gw.url}/api/v1/keys`, { key: t.managementKey, body: 'name=x', headers: { 'content-type': 'text/plain' } });
    expect(text.status).to.equal(400);
    expect(text.body.error.message).to.equal('Content-Type must be application/json, not "text/plain"');
    const none = await call(`${gw.url}/api/v1/keys`, { method: 'POST', key: t.managementKey });
    expect(none.body.error).to.include({ code: 400, message: 'Request body is required (a JSON document)' });
    const scalar = await call(`${gw.url}/api/v1/keys`, { key: t.managementKey, body: '"just a string"' });
    expect(scalar.status).to.equal(400);
    // The media type is compared without case or parameters, and must be exactly application/json.
    for (const type of ['application/jsonx', 'application/json garbage', 'application/problem+json', 'text/json', '']) {
      const r = await call(`${gw.url}/api/v1/keys`, { key: t.managementKey, body: '{"name":"x"}', headers: { 'content-type': type } });
      expect(r.status, type).to.equal(400);
      expect(r.body.error.message, type).to.match(/^Content-Type must be application\/json/);
    }
    const cased = await call(`${gw.url}/api/v1/keys`, {
      key: t.managementKey,
      body: '{"name":"cased"}',
      headers: { 'content-type': ' Application/JSON ; charset="UTF-8"' },
    });
    expect(cased.status, JSON.stringify(cased.body)).to.equal(201);
  });

  it('400 naming the failing field for schema violations', async () => {
    const wrongEnum = await call(`${gw.url}/api/v1/keys`, { key: t.managementKey, body: { kind: 'admin' } });
    expect(wrongEnum.body.error.message).to.equal('kind: must be one of "inference", "management"');
    const extraField = await call(`${gw.url}/api/v1/keys`, { key: t.managementKey, body: { nickname: 'x' } });
    expect(extraField.body.error.message).to.equal('nickname: is not an allowed field');
    const tooLong = await call(`${gw.url}/api/v1/keys`, { key: t.managementKey, body: { name: 'n'.repeat(101) } });
    expect(tooLong.body.error.message).to.equal('name: must NOT have more than 100 characters');
    expect(tooLong.body.error.metadata.errors[0]).to.deep.equal({ field: 'name', message: 'must NOT have more than 100 characters' });
    const badParam = await call(`${gw.url}/api/v1/keys/not-a-key-id`, { key: t.managementKey });
    expect(badParam.status).to.equal(400);
    expect(badParam.body.error.message).to.match(/^id: must match pattern/);
    const missingQuery = await call(`${gw.url}/api/v1/generation`, { key: t.inferenceKey });
    expect(missingQuery.body.error.message).to.equal('id: is required');
  });

  it('404 in the envelope for unknown routes and for objects that do not exist', async () => {
    const route = await call(`${gw.url}/api/v1/no-such-thing`, { key: t.inferenceKey });
    expect(route.body).to.deep.equal(envelope(404, 'No route for GET /api/v1/no-such-thing'));
    const key = await call(`${gw.url}/api/v1/keys/key_${'a'.repeat(24)}`, { key: t.managementKey });
    expect(key.body).to.deep.equal(envelope(404, `API key key_${'a'.repeat(24)} not found`, null, t.managementKeyId));
  });

  it('405 in the envelope for a wrong method on an API route', async () => {
    const r = await call(`${gw.url}/api/v1/credits`, { method: 'PUT', key: t.inferenceKey });
    expect(r.status).to.equal(405);
    expect(r.body.error.code).to.equal(405);
  });

  it('413 when the body is over the configured limit', async () => {
    const r = await call(`${gw.url}/api/v1/keys`, { key: t.managementKey, body: { name: 'x'.repeat(2048) } });
    expect(r.status).to.equal(413);
    expect(r.body).to.deep.equal(envelope(413, 'Request body is larger than the configured limit', null, t.managementKeyId));
  });

  it('reads a chunked body written at once as one that trickles in: as sent under the limit, 413 over it', async () => {
    const port = Number(new URL(gw.url).port);
    /** The request, its body in two chunks, written at once or a piece every 30 ms; resolves with the answer. */
    const exchange = (body: string, trickle: boolean) =>
      new Promise<string>((resolve, reject) => {
        const half = Math.floor(body.length / 2);
        const pieces = [
          `POST /api/v1/keys HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${t.managementKey}\r\n` +
            'Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n',
          ...[body.slice(0, half), body.slice(half)].map((c) => `${Buffer.byteLength(c).toString(16)}\r\n${c}\r\n`),
          '0\r\n\r\n',
        ];
        const socket = net.connect(port, '127.0.0.1');
        let answer = '';
        socket.on('data', (b) => (answer += b));
        socket.on('end', () => resolve(answer));
        socket.on('error', reject);
        if (!trickle) socket.write(pieces.join(''));
        else pieces.forEach((p, i) => setTimeout(() => socket.writable && socket.write(p), i * 30));
      });
    for (const trickle of [false, true]) {
      const ok = await exchange(JSON.stringify({ name: `chunked-${trickle}` }), trickle);
      expect(ok, `trickle ${trickle}`).to.match(/^HTTP\/1\.1 201 /);
      expect(ok).to.include(`"name":"chunked-${trickle}"`);
      const big = await exchange(JSON.stringify({ name: 'x'.repeat(2048) }), trickle);
      expect(big, `trickle ${trickle}`).to.match(/^HTTP\/1\.1 413 /);
      expect(big).to.include('Request body is larger than the configured limit');
    }
  });

  it('never writes a key to the log', async () => {
    await call(`${gw.url}/api/v1/key`, { key: t.inferenceKey });
    await call(`${gw.url}/api/v1/credits`, { headers: { authorization: `Bearer ${t.managementKey}` } });
    const all = JSON.stringify(lines);
    expect(all).to.not.include(t.inferenceKey).and.not.include(t.managementKey);
    expect(lines.length).to.be.greaterThan(2);
  });
});

describe('authenticated-key cache', () => {
  let gw: TestGateway;
  before(async () => {
    gw = await startTestGateway({ withWorker: false });
  });
  after(async () => {
    await gw.stop();
  });

  it('remembers live keys for its TTL, refuses a key revoked elsewhere after it, and forgets on request', async () => {
    const t = await createTenant(gw.store);
    let now = 1_000;
    const cache = new KeyCache(gw.store, 5_000, 100, () => now);
    expect((await cache.authenticate(t.inferenceKey))?.id).to.equal(t.inferenceKeyId);
    // Revoked behind the cache's back, as another process would: still trusted within the TTL …
    await gw.store.apiKeys.updateOne({ id: t.inferenceKeyId }, { $set: { revoked_at: new Date() } });
    now += 4_999;
    expect((await cache.authenticate(t.inferenceKey))?.id).to.equal(t.inferenceKeyId);
    // … and refused once it runs out.
    now += 1;
    expect(await cache.authenticate(t.inferenceKey)).to.equal(null);
    expect(cache.size).to.equal(0);

    expect((await cache.authenticate(t.managementKey))?.id).to.equal(t.managementKeyId);
    await gw.store.apiKeys.updateOne({ id: t.managementKeyId }, { $set: { revoked_at: new Date() } });
    cache.forget(t.managementKeyId);
    expect(await cache.authenticate(t.managementKey)).to.equal(null);
  });

  it('re-reads a key in use past half its TTL in the background: the call does not wait, the next one sees a revocation', async () => {
    const t = await createTenant(gw.store);
    let now = 1_000;
    const cache = new KeyCache(gw.store, 5_000, 100, () => now);
    expect((await cache.authenticate(t.inferenceKey))?.id).to.equal(t.inferenceKeyId);
    await gw.store.apiKeys.updateOne({ id: t.inferenceKeyId }, { $set: { revoked_at: new Date() } });
    now += 2_499;
    expect((await cache.authenticate(t.inferenceKey))?.id).to.equal(t.inferenceKeyId);
    expect(cache.size).to.equal(1); // younger than half the TTL: nothing re-read
    now += 1;
    // Answered from memory although the store already says revoked: it did not wait for the read …
    expect((await cache.authenticate(t.inferenceKey))?.id).to.equal(t.inferenceKeyId);
    // … which, once back, drops the key, so a call still within the TTL is refused.
    for (let i = 0; i < 100 && cache.size > 0; i++) await new Promise((r) => setTimeout(r, 20));
    expect(cache.size).to.equal(0);
    expect(await cache.authenticate(t.inferenceKey)).to.equal(null);

    // A live key in use is renewed before it runs out, so it never waits for the store: read at
    // 1,000 ms and renewed at 4,000, it is still trusted at 6,500 (without the renewal it would have
    // expired at 6,000, been read again, and refused).
    let clockReads = 0;
    now = 1_000;
    const renewing = new KeyCache(gw.store, 5_000, 100, () => (clockReads++, now));
    expect(await renewing.authenticate(t.managementKey)).to.not.equal(null);
    now = 4_000;
    const before = clockReads;
    expect(await renewing.authenticate(t.managementKey)).to.not.equal(null); // starts the re-read
    const readAt = clockReads; // the re-read stamps its entry with one more reading of the clock
    for (let i = 0; i < 100 && clockReads === readAt; i++) await new Promise((r) => setTimeout(r, 20));
    expect(clockReads - before).to.equal(2);
    await gw.store.apiKeys.updateOne({ id: t.managementKeyId }, { $set: { revoked_at: new Date() } });
    now = 6_500;
    expect((await renewing.authenticate(t.managementKey))?.id).to.equal(t.managementKeyId);
  });

  it('refuses a key forgotten while a read of it was in flight, and does not remember that read', async () => {
    const t = await createTenant(gw.store);
    // Key reads that have their document but answer only when the gate opens.
    let open!: () => void;
    const gate = new Promise<void>((resolve) => (open = resolve));
    let fetched = 0;
    const store = storeWith(gw.store, 'apiKeys', (keys) => ({
      find: (...args: Parameters<typeof keys.find>) => ({
        toArray: async () => {
          const docs = await keys.find(...args).toArray();
          fetched++;
          await gate;
          return docs;
        },
      }),
    }));
    const cache = new KeyCache(store, 5_000, 100);

    const before = cache.authenticate(t.inferenceKey); // reads the key while it is live …
    for (let i = 0; i < 100 && fetched === 0; i++) await new Promise((r) => setTimeout(r, 10));
    await gw.store.apiKeys.updateOne({ id: t.inferenceKeyId }, { $set: { revoked_at: new Date() } });
    cache.forget(t.inferenceKeyId); // … and is revoked through this process before that read answers
    const after = cache.authenticate(t.inferenceKey); // read afresh once the read in flight is done
    open();
    expect((await before)?.id).to.equal(t.inferenceKeyId); // asked before the revocation
    expect(await after).to.equal(null);
    expect(fetched).to.equal(2);
    expect(cache.size).to.equal(0);
  });

  it('looks up tokens not in memory together: a flood of made-up keys costs a few reads, and a live key among them is found', async () => {
    const t = await createTenant(gw.store);
    const reads: number[] = [];
    const store = storeWith(gw.store, 'apiKeys', (keys) => ({
      find: (filter: { _id: { $in: string[] } }) => {
        reads.push(filter._id.$in.length);
        return keys.find(filter);
      },
    }));
    const cache = new KeyCache(store, 5_000, 100);
    const madeUp = Array.from({ length: 250 }, () => `sk-gw-v1-${randomBytes(32).toString('hex')}`);
    const tokens = [...madeUp.slice(0, 120), t.inferenceKey, ...madeUp.slice(120)];
    const found = await Promise.all(tokens.map((k) => cache.authenticate(k)));
    expect(found.filter((k) => k !== null).map((k) => k!.id)).to.deep.equal([t.inferenceKeyId]);
    // 251 tokens asked at once: reads of at most 100 ids, one after another.
    expect(reads).to.deep.equal([100, 100, 51]);
    // Asked while a read is in flight, tokens wait for it and go together in the next.
    reads.length = 0;
    const first = cache.authenticate(madeUp[0]);
    await new Promise((r) => setImmediate(r)); // its read is sent
    const meanwhile = Promise.all(madeUp.slice(1, 40).map((k) => cache.authenticate(k)));
    expect(await first).to.equal(null);
    expect(await meanwhile).to.deep.equal(Array(39).fill(null));
    expect(reads).to.deep.equal([1, 39]);
  });

  it('keeps no unknown or malformed tokens, and at most its bound of live ones', async () => {
    const cache = new KeyCache(gw.store, 60_000, 2);
    expect(await cache.authenticate(`sk-gw-v1-${'0'.repeat(64)}`)).to.equal(null);
    expect(await cache.authenticate('not a key')).to.equal(null);
    expect(cache.size).to.equal(0);
    const [a, b] = [await createTenant(gw.store), await createTenant(gw.store)];
    for (const key of [a.inferenceKey, a.managementKey, b.inferenceKey]) expect(await cache.authenticate(key)).to.not.equal(null);
    expect(cache.size).to.equal(2);
  });
});

describe('402, 500 and the billable guard', () => {
  let gw: TestGateway;
  let server: http.Server;
  let url: string;
  const { logger, lines } = capturingLogger('debug');

  before(async () => {
    gw = await startTestGateway({ withWorker: false });
    // A Koa app assembled from the real middleware and route machinery, with two routes of its own:
    // one billable, one that fails unexpectedly.
    const app = new Koa();
    app.silent = true;
    app.use(requestContext(logger));
    app.use(errorMiddleware());
    const router = new Router();
    const deps = {
      config: gw.config,
      logger,
      store: gw.store,
      temporal: null as never,
      decisions: null as never,
      pingTemporal: async () => undefined,
      rateLimiter: new RateLimiter(gw.store, 1000, 60),
      workspaceRequests: new RateLimiter(gw.store, 10_000, 60),
      batchCreates: null as never,
      listPages: null as never,
      bodyBytes: null as never,
      resultBytes: null as never,
      storage: null as never,
      presetVersions: new KeptVersions(),
      upstreams: null as never,
      usage: null as never,
      metrics: new Metrics(),
      workspaces: new SpendAdmission(gw.store, 0),
      keys: new KeyCache(gw.store, 0),
      broadcast: null as never,
      batchBodies: null as never,
      bodyMemory: null as never,
    }; // no caching: every call reads the ledger
    mountRoutes(
      router,
      [
        defineRoute({
          method: 'post',
          path: '/spend',
          summary: 'billable',
          tag: 't',
          auth: 'any',
          billable: true,
          body: Type.Object({}),
          responses: {},
          handler: (ctx) => {
            ctx.body = { ok: true };
          },
        }),
        defineRoute({
          method: 'get',
          path: '/boom',
          summary: 'fails',
          tag: 't',
          auth: 'none',
          responses: {},
          handler: () => {
            throw new TypeError('secret detail: mongodb://admin:pw@db');
          },
        }),
      ],
      deps,
    );
    ({ server, url } = await serve(app, router));
  });
  after(async () => {
    server.close();
    await gw.stop();
  });

  it('402 for a billable call while the balance is not positive, 200 once credits are added', async () => {
    const broke = await createTenant(gw.store, 0);
    const r = await call(`${url}/spend`, { key: broke.inferenceKey, body: {} });
    expect(r.status).to.equal(402);
    expect(r.body).to.deep.equal(
      envelope(402, 'Insufficient credits: add credits to this workspace to continue', { balance: 0 }, broke.inferenceKeyId),
    );

    const rich = await createTenant(gw.store, 1);
    expect((await call(`${url}/spend`, { key: rich.inferenceKey, body: {} })).status).to.equal(200);
    // Spending the whole balance makes the next billable call 402 again.
    await new UsageLedger(gw.store).record(usageRecord('gen-spend-all', rich.workspaceId, rich.inferenceKeyId, 1));
    expect((await call(`${url}/spend`, { key: rich.inferenceKey, body: {} })).status).to.equal(402);
  });

  it('a process trusts its balance reading for the cache period, then re-reads the ledger without making requests wait', async () => {
    let now = 0;
    const cache = new SpendAdmission(gw.store, 5_000, () => now);
    const t = await createTenant(gw.store, 1);
    await cache.assertCanSpend(t.workspaceId);
    await new UsageLedger(gw.store).record(usageRecord(`gen-cache-${t.workspaceId}`, t.workspaceId, t.inferenceKeyId, 1));
    now = 4_999;
    await cache.assertCanSpend(t.workspaceId); // still the earlier reading
    now = 5_000;
    // Expired: this request is answered from the earlier reading while one re-read starts...
    await cache.assertCanSpend(t.workspaceId);
    expect(cache['accounts'].peek(t.workspaceId)?.loading).to.equal(null); // answered before the re-read even started
    // ...and once it is in, the spending shows.
    let status = 0;
    for (let i = 0; i < 100 && status !== 402; i++) {
      await cache.assertCanSpend(t.workspaceId).then(
        () => new Promise((r) => setTimeout(r, 10)),
        (err: { status: number }) => {
          status = err.status;
        },
      );
    }
    expect(status).to.equal(402);
  });

  it('GET /credits and GET /key never answer from a reading older than the cache period: after a quiet spell, they wait for a fresh one', async () => {
    let now = 0;
    const cache = new SpendAdmission(gw.store, 5_000, () => now);
    const t = await createTenant(gw.store, 1);
    expect((await cache.balance(t.workspaceId)).balance).to.equal(1);
    // Another process spends.
    await new UsageLedger(gw.store).record(usageRecord(`gen-quiet-${t.workspaceId}`, t.workspaceId, t.inferenceKeyId, 0.25));
    now = 4_999;
    expect((await cache.balance(t.workspaceId)).balance, 'within the period: the reading').to.equal(1);
    now = 5_000;
    expect((await cache.balance(t.workspaceId)).balance, 'past it: a fresh reading, not the old one').to.equal(0.75);
  });

  it('500 with a generic message; the details only in the log', async () => {
    const r = await call(`${url}/boom`);
    expect(r.status).to.equal(500);
    expect(r.body).to.deep.equal(envelope(500, 'Internal server error'));
    expect(JSON.stringify(r.body)).to.not.include('secret');
    const logged = lines.find((l) => l.msg === 'unhandled error');
    expect(JSON.stringify(logged)).to.include('secret detail');
  });
});

describe('rate limits', () => {
  let gw: TestGateway;
  let t: Tenant;

  before(async () => {
    gw = await startTestGateway({ withWorker: false, env: { RATE_LIMIT_REQUESTS: '3', RATE_LIMIT_WINDOW_SECONDS: '3600' } });
    t = await createTenant(gw.store);
  });
  beforeEach(() => clearOfWindowEdge());
  after(async () => {
    await gw.stop();
  });

  it('reports the limit on every response and answers 429 with Retry-After past it', async () => {
    const remaining: string[] = [];
    for (let i = 0; i < 3; i++) {
      const r = await call(`${gw.url}/api/v1/credits`, { key: t.inferenceKey });
      expect(r.status).to.equal(200);
      expect(r.headers.get('x-ratelimit-limit')).to.equal('3');
      expect(Number(r.headers.get('x-ratelimit-reset'))).to.be.greaterThan(Date.now() / 1000);
      remaining.push(r.headers.get('x-ratelimit-remaining')!);
    }
    expect(remaining).to.deep.equal(['2', '1', '0']);
    const limited = await call(`${gw.url}/api/v1/credits`, { key: t.inferenceKey });
    expect(limited.status).to.equal(429);
    expect(limited.body.error.code).to.equal(429);
    expect(limited.body.error.message).to.equal('Rate limit exceeded: 3 requests per 3600s for this key');
    expect(Number(limited.headers.get('retry-after'))).to.be.within(1, 3600);
    expect(limited.headers.get('x-ratelimit-remaining')).to.equal('0');
    // Another key of the same workspace has its own budget.
    expect((await call(`${gw.url}/api/v1/credits`, { key: t.managementKey })).status).to.equal(200);
  });

  it('is shared between API processes: two gateways admit the limit in total, exactly', async () => {
    const other = await startTestGateway({
      withWorker: false,
      env: { RATE_LIMIT_REQUESTS: '5', RATE_LIMIT_WINDOW_SECONDS: '3600', MONGODB_DATABASE: gw.config.mongo.database },
    });
    const first = await startTestGateway({
      withWorker: false,
      env: { RATE_LIMIT_REQUESTS: '5', RATE_LIMIT_WINDOW_SECONDS: '3600', MONGODB_DATABASE: gw.config.mongo.database },
    });
    try {
      const tenant = await createTenant(gw.store);
      const calls = [];
      for (let i = 0; i < 6; i++) calls.push(call(`${(i % 2 ? other : first).url}/api/v1/credits`, { key: tenant.inferenceKey }));
      for (let i = 0; i < 4; i++) calls.push(call(`${(i % 2 ? first : other).url}/api/v1/credits`, { key: tenant.inferenceKey }));
      const statuses = (await Promise.all(calls)).map((r) => r.status);
      expect(statuses.filter((s) => s === 200)).to.have.length(5);
      expect(statuses.filter((s) => s === 429)).to.have.length(5);
    } finally {
      await other.stop();
      await first.stop();
    }
  });

  it('opens a new window when the old one ends', async () => {
    let now = 1_000_000_000_000;
    const limiter = new RateLimiter(gw.store, 2, 60, () => now);
    const key = `key_window_${Date.now()}`;
    expect((await limiter.take(key)).allowed).to.equal(true);
    expect((await limiter.take(key)).allowed).to.equal(true);
    const denied = await limiter.take(key);
    expect(denied).to.include({ allowed: false, remaining: 0 });
    expect(denied.retryAfterSeconds).to.be.within(1, 60);
    now += 60_000;
    expect(await limiter.take(key)).to.include({ allowed: true, remaining: 1 });
  });
});

describe('rate limits per workspace', () => {
  let gw: TestGateway;
  before(async () => {
    gw = await startTestGateway({
      withWorker: false,
      env: { RATE_LIMIT_REQUESTS: '5', RATE_LIMIT_WORKSPACE_REQUESTS: '8', RATE_LIMIT_WINDOW_SECONDS: '3600' },
    });
  });
  beforeEach(() => clearOfWindowEdge());
  after(async () => {
    await gw.stop();
  });

  it("counts a workspace's requests over all its keys, reports the limit that binds first, and leaves other workspaces alone", async () => {
    const [a, b] = [await createTenant(gw.store), await createTenant(gw.store)];
    const credits = (key: string) => call(`${gw.url}/api/v1/credits`, { key });
    const seen = (r: Awaited<ReturnType<typeof call>>) => [
      r.status,
      r.headers.get('x-ratelimit-limit'),
      r.headers.get('x-ratelimit-remaining'),
    ];
    const burst = async (key: string, n: number) => {
      const out = [];
      for (let i = 0; i < n; i++) out.push(seen(await credits(key)));
      return out;
    };
    // The first key's own limit binds first: 5 of the workspace's 8.
    expect(await burst(a.inferenceKey, 5)).to.deep.equal([
      [200, '5', '4'],
      [200, '5', '3'],
      [200, '5', '2'],
      [200, '5', '1'],
      [200, '5', '0'],
    ]);
    const keyRefused = await credits(a.inferenceKey);
    expect(keyRefused.status).to.equal(429);
    expect(keyRefused.body.error.message).to.equal('Rate limit exceeded: 5 requests per 3600s for this key');
    // A request its key refused took nothing of the workspace's: the second key has 3 left, not 2.
    expect(await burst(a.managementKey, 3)).to.deep.equal([
      [200, '8', '2'],
      [200, '8', '1'],
      [200, '8', '0'],
    ]);
    const refused = await credits(a.managementKey);
    expect(refused.status).to.equal(429);
    expect(refused.body.error.message).to.equal('Rate limit exceeded: 8 requests per 3600s for this workspace, over all its keys');
    expect(refused.body.error.metadata).to.include({ limit: 8, window_seconds: 3600 });
    expect(Number(refused.headers.get('retry-after'))).to.be.within(1, 3600);
    // Making another key is refused too: the workspace's limit covers every request of its keys.
    const made = await call(`${gw.url}/api/v1/keys`, { key: a.managementKey, body: { kind: 'inference' } });
    expect(made.status).to.equal(429);
    // Another workspace's requests are its own.
    expect(seen(await credits(b.inferenceKey))).to.deep.equal([200, '5', '4']);
    const metrics = await (await fetch(`${gw.url}/metrics`)).text();
    expect(metrics).to.include('gateway_rate_limit_rejections_total{scope="key"} 1');
    expect(metrics).to.include('gateway_rate_limit_rejections_total{scope="workspace"} 2');
  });
});

// What costs far more than the one request it counts as is limited per workspace on its own.
describe('per-workspace limits on batch creations, list pages and body bytes', () => {
  let gw: TestGateway;
  before(async () => {
    gw = await startTestGateway({
      withWorker: false,
      env: { BATCH_CREATES_PER_MINUTE: '3', LIST_PAGES_PER_MINUTE: '3', BODY_BYTES_PER_MINUTE: '1mb' },
    });
  });
  after(async () => {
    await gw.stop();
  });

  it("counts a workspace's creates over all its keys: past the limit a 429 before the body is read, and another workspace creates meanwhile", async () => {
    await clearOfWindowEdge(60, 15_000);
    const [a, b] = [await createTenant(gw.store), await createTenant(gw.store)];
    const body = {
      endpoint: '/v1/chat/completions',
      model: 'sandbox/chat-1',
      requests: [{ custom_id: 'x', body: { messages: [{ role: 'user', content: 'hi' }] } }],
    };
    // Three creates through two keys: the workspace's limit, not each key's.
    for (const key of [a.inferenceKey, a.managementKey, a.inferenceKey]) {
      const created = await call(`${gw.url}/api/v1/batches`, { key, body });
      expect(created.status, JSON.stringify(created.body)).to.equal(202);
    }
    const refused = await call(`${gw.url}/api/v1/batches`, { key: a.managementKey, body });
    expect(refused.status).to.equal(429);
    expect(refused.body.error.message).to.equal('Batch creation rate limit exceeded: 3 batches per 60s for this workspace');
    expect(refused.body.error.metadata).to.include({ limit: 3, window_seconds: 60 });
    expect(Number(refused.headers.get('retry-after'))).to.be.within(1, 60);
    expect(refused.headers.get('connection')).to.equal('close');
    // Nothing of the refused one was stored.
    const listed = await call(`${gw.url}/api/v1/batches?limit=10`, { key: a.inferenceKey });
    expect(listed.body.data).to.have.length(3);
    // Another workspace's limit is its own; other requests of the first go on.
    expect((await call(`${gw.url}/api/v1/batches`, { key: b.inferenceKey, body })).status).to.equal(202);
    expect((await call(`${gw.url}/api/v1/credits`, { key: a.inferenceKey })).status).to.equal(200);
  });

  it("counts a workspace's pages of batches and keys over all its keys: past the limit a 429, and another workspace lists meanwhile", async () => {
    await clearOfWindowEdge(60, 15_000);
    const [a, b] = [await createTenant(gw.store), await createTenant(gw.store)];
    // Three pages through two keys and both lists: the workspace's limit, not each key's or list's.
    for (const [key, path] of [
      [a.inferenceKey, '/batches?limit=100'],
      [a.managementKey, '/keys?limit=100'],
      [a.managementKey, '/batches'],
    ]) {
      const listed = await call(`${gw.url}/api/v1${path}`, { key });
      expect(listed.status, JSON.stringify(listed.body)).to.equal(200);
    }
    for (const [key, path] of [
      [a.inferenceKey, '/batches?limit=1'],
      [a.managementKey, '/keys'],
    ]) {
      const refused = await call(`${gw.url}/api/v1${path}`, { key });
      expect(refused.status).to.equal(429);
      expect(refused.body.error.message).to.equal(
        'List rate limit exceeded: 3 pages of batches or keys per 60s for this workspace, over all its keys',
      );
      expect(refused.body.error.metadata).to.include({ limit: 3, window_seconds: 60 });
      expect(Number(refused.headers.get('retry-after'))).to.be.within(1, 60);
    }
    // Another workspace's limit is its own; the first's other requests go on.
    expect((await call(`${gw.url}/api/v1/batches`, { key: b.inferenceKey })).status).to.equal(200);
    expect((await call(`${gw.url}/api/v1/keys`, { key: b.managementKey })).status).to.equal(200);
    expect((await call(`${gw.url}/api/v1/key`, { key: a.inferenceKey })).status).to.equal(200);
    expect((await call(`${gw.url}/api/v1/presets`, { key: a.inferenceKey })).status).to.equal(200);
  });

  it("counts a workspace's large bodies over all its keys before they are parsed: past the limit a 429, small bodies and other workspaces go on", async () => {
    await clearOfWindowEdge(60, 15_000);
    const [a, b] = [await createTenant(gw.store), await createTenant(gw.store)];
    const chat = (key: string, contentBytes: number) =>
      call(`${gw.url}/api/v1/chat/completions`, {
        key,
        body: { model: 'sandbox/chat-1', max_tokens: 1, messages: [{ role: 'user', content: 'x'.repeat(contentBytes) }] },
      });
    // 1 MB is 16 units of 64 KB; a 400 KB body is 6: two fit, through two keys, and the third does not.
    for (const key of [a.inferenceKey, a.managementKey]) expect((await chat(key, 400 * 1024)).status).to.equal(200);
    // Refused before it is parsed: not JSON at all, it gets the 429, not a 400.
    const refused = await call(`${gw.url}/api/v1/chat/completions`, { key: a.inferenceKey, body: `{"model": ${'x'.repeat(400 * 1024)}` });
    expect(refused.status).to.equal(429);
    expect(refused.body.error.message).to.equal(
      'Request body rate limit exceeded: 1 MB of request bodies per 60s for this workspace, over all its keys',
    );
    expect(refused.body.error.metadata).to.include({ limit_bytes: 1024 ** 2, window_seconds: 60 });
    expect(Number(refused.headers.get('retry-after'))).to.be.within(1, 60);
    // Bodies under 64 KB are not counted; another workspace's bytes are its own.
    expect((await chat(a.inferenceKey, 60 * 1024)).status).to.equal(200);
    expect((await chat(b.inferenceKey, 400 * 1024)).status).to.equal(200);
  });
});

describe('inline decisions: errors as thrown, not through Temporal', () => {
  let gw: TestGateway;
  let server: http.Server;
  let url: string;
  let upstreams: ReturnType<typeof createUpstreams>;

  before(async () => {
    gw = await startTestGateway({ withWorker: false });
    // The decision route over a ledger whose database times out on every insert.
    const timingOut = storeWith(gw.store, 'usage', () => ({
      insertMany: async () => {
        const err = new Error('operation exceeded time limit');
        err.name = 'MongoOperationTimeoutError';
        throw err;
      },
    }));
    upstreams = createUpstreams(gw.config, gw.store);
    const deps = {
      config: gw.config,
      store: gw.store,
      decisions: inlineExecution(decisionService({ upstreams, record: (r) => new UsageLedger(timingOut).record(r) })),
      upstreams,
      workspaces: new SpendAdmission(gw.store, 0),
      metrics: new Metrics(),
      keys: new KeyCache(gw.store, 0),
      rateLimiter: new RateLimiter(gw.store, 1000, 60),
      workspaceRequests: new RateLimiter(gw.store, 10_000, 60),
    } as unknown as AppDeps;
    const app = new Koa();
    app.silent = true;
    app.use(requestContext(createLogger('silent')));
    app.use(errorMiddleware());
    const router = new Router();
    mountRoutes(router, decisionRoutes(deps), deps);
    ({ server, url } = await serve(app, router));
  });
  after(async () => {
    server.close();
    await upstreams.close();
    await gw.stop();
  });

  it('a database timeout while billing is a 503 naming the database (it read "orchestration service" when wrapped as a Temporal failure)', async () => {
    const t = await createTenant(gw.store, 1);
    const r = await call(`${url}/systemone`, {
      key: t.inferenceKey,
      body: { model: 'jev-1.13', state: 'x', questions: { q: { type: 'noul', instructions: 'ok?' } } },
    });
    expect(r.status, JSON.stringify(r.body)).to.equal(503);
    expect(r.body.error.message).to.equal('The database is unavailable right now; try again shortly');
  });
});

describe('a database whose disk is full', () => {
  it('is a 503 saying so, not a 500, and logged as such', async () => {
    const { logger, lines } = capturingLogger('info');
    const app = new Koa();
    app.silent = true;
    app.use(requestContext(logger));
    app.use(errorMiddleware());
    const router = new Router();
    // As the embedded FerretDB refused a batch's insert with its disk full (probed).
    const sqlite = '[msg_insert.go:168 handler.(*Handler).MsgInsert] [db.go:167 fsql.(*DB).InTransaction] database or disk is full (13)';
    router.post('/store', () => {
      throw new MongoBulkWriteError(
        { message: sqlite, code: 1, writeErrors: [{ index: 0, code: 1, errmsg: sqlite }] } as never,
        {
          insertedCount: 0,
        } as never,
      );
    });
    const { server, url } = await serve(app, router);
    try {
      const r = await call(`${url}/store`, { body: {} });
      expect(r.status).to.equal(503);
      expect(r.body.error.message).to.equal('The database cannot store anything more right now (its disk is full); try again later');
      expect(lines.some((l) => l.msg === 'database disk full' && String(l.reason).includes('disk is full'))).to.equal(true);
    } finally {
      server.close();
    }
  });
});

/** Serves an app with a router's routes on a free loopback port. */
async function serve(app: Koa, router: Router): Promise<{ server: http.Server; url: string }> {
  app.use(router.routes() as Koa.Middleware);
  const server = http.createServer(app.callback()).listen(0, '127.0.0.1');
  await new Promise((r) => server.once('listening', r));
  return { server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` };
}
