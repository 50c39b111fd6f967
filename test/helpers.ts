// Shared test plumbing: an isolated gateway (own database, own task queue) on the run's real services.
import { expect } from 'chai';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { DEFAULT_CATALOG_PATH, loadConfig, type Config } from '../infrastructure/config';
import { createLogger, type Logger } from '../infrastructure/log';
import { runApiRole } from '../cli/roles';
import { freePort, startProcess, type ManagedProcess } from '../devstack/processes';
import { stack } from './fixture';
import type { Collection, Filter } from 'mongodb';
import { Store, type UsageDoc } from '../infrastructure/store';
import { fromStoredUsage, type StoredUsageDoc } from '../infrastructure/store/usage-form';
import { createWorkspace } from '../domain/accounts/workspaces';
import { createKey } from '../domain/accounts/keys';
import { grantCredits } from '../domain/accounts/credits';
import { UsageLedger, usageDetails, usageRecordOf, type UsageRecord } from '../domain/accounts/usage-ledger';
import { SpendAdmission } from '../domain/accounts/spend-admission';
import { createActivities } from '../activities';
import type { Upstreams } from '../domain/routing/upstreams';
import { newBatchId, type BatchDoc } from '../domain/batches/store';
import type { DecisionHandoff } from '../infrastructure/temporal/decision-handoff';

/** Six random bytes: a test makes hundreds within one millisecond (three bytes collided once in 300). */
export function uniqueName(prefix: string): string {
  return `${prefix}-${Date.now().toString(36)}-${randomBytes(6).toString('hex')}`;
}

export interface TestGateway {
  url: string;
  config: Config;
  /** A connection of the test's own to the gateway's database. */
  store: Store;
  /** The API's usage ledger: `flushed()` waits until the records of calls answered so far are stored. */
  usage: UsageLedger;
  stop(): Promise<void>;
}

export interface Tenant {
  workspaceId: string;
  managementKey: string;
  inferenceKey: string;
  inferenceKeyId: string;
  managementKeyId: string;
}

/** A workspace with credits, one management and one inference key. */
export async function createTenant(store: Store, credits = 10): Promise<Tenant> {
  const ws = await createWorkspace(store, uniqueName('ws'));
  if (credits > 0) await grantCredits(store, ws._id, credits);
  const m = await createKey(store, ws._id, { kind: 'management' });
  const i = await createKey(store, ws._id, { kind: 'inference' });
  return { workspaceId: ws._id, managementKey: m.key, managementKeyId: m.id, inferenceKey: i.key, inferenceKeyId: i.id };
}

/** fetch against the gateway with a bearer key and a JSON body; returns status, headers and parsed body. */
export async function call(url: string, opts: { method?: string; key?: string; body?: unknown; headers?: Record<string, string> } = {}) {
  const headers: Record<string, string> = { ...opts.headers };
  if (opts.key) headers.authorization = `Bearer ${opts.key}`;
  let payload: string | undefined;
  if (opts.body !== undefined) {
    payload = typeof opts.body === 'string' ? opts.body : JSON.stringify(opts.body);
    headers['content-type'] ??= 'application/json';
  }
  const method = opts.method ?? (payload ? 'POST' : 'GET');
  const res = await fetch(url, { method, headers, body: payload }).catch((err: Error) => {
    // fetch says only "fetch failed"; what failed (a reset, a refusal, a timeout) is its cause.
    const cause = err.cause as (Error & { code?: string }) | undefined;
    throw new Error(`${method} ${url}: ${err.message}${cause ? ` (${cause.code ?? ''} ${cause.message})` : ''}`, { cause: err });
  });
  const text = await res.text();
  let body: any = text;
  try {
    body = JSON.parse(text);
  } catch {
    /* not JSON */
  }
  return { status: res.status, headers: res.headers, body };
}

/**
 * A route's JSON answer (api/send-json) is written before the middleware chain unwinds: it must
 * still carry what the layers set on the way in, with the JSON's own type and length.
 */
export function expectJsonAnswerHeaders(r: { headers: Headers; body: unknown }): void {
  expect(r.headers.get('content-type')).to.equal('application/json; charset=utf-8');
  expect(Number(r.headers.get('content-length'))).to.equal(Buffer.byteLength(JSON.stringify(r.body)));
  expect(r.headers.get('x-request-id')).to.match(/^[0-9a-f-]{36}$/);
  expect(r.headers.get('x-ratelimit-remaining')).to.match(/^\d+$/);
}

export async function startTestGateway(
  opts: {
    withWorker?: boolean;
    env?: Record<string, string>;
    /** Shrinks timers that are constants in production (not environment variables: no operator needs them). */
    tune?: (config: Config) => void;
    logger?: Logger;
    mongoUri?: string;
  } = {},
): Promise<TestGateway> {
  const mongoUri = opts.mongoUri ?? stack.mongoUri;
  const config = loadConfig({
    PORT: String(await freePort()),
    MONGODB_URI: mongoUri,
    MONGODB_DATABASE: uniqueName('db').replace(/-/g, '_'),
    TEMPORAL_ADDRESS: stack.temporalAddress,
    TEMPORAL_TASK_QUEUE: uniqueName('tq'),
    LOG_LEVEL: 'silent',
    SANDBOX_URL: stack.sandboxUrl,
    DATA_DIR: path.join(stack.tmpDir, uniqueName('gateway-data')),
    ...opts.env,
  });
  opts.tune?.(config);
  const logger = opts.logger ?? createLogger('silent');
  const api = await runApiRole(
    config,
    logger,
    { mongoUri, temporalAddress: stack.temporalAddress },
    { withWorker: opts.withWorker ?? true },
  );
  const store = await Store.connect(mongoUri, config.mongo.database);
  return {
    url: api.url,
    config,
    store,
    usage: api.usage,
    stop: async () => {
      await store.close();
      await api.stop();
    },
  };
}

/** A minimal usage record (one billed call) for tests that spend a workspace's credits directly. */
export function usageRecord(id: string, workspaceId: string, keyId: string, cost: number): UsageRecord {
  return usageRecordOf(
    {
      generationId: id,
      workspaceId,
      keyId,
      kind: 'decision',
      meta: { session_id: null, user: null, app: { referer: null, title: null, categories: [] } },
    },
    { model: 'm', provider: 'p', usage: { input_tokens: 1, output_tokens: 1 }, cost },
  );
}

/** The default catalog with a test's own providers and models added, written to a file for CATALOG_PATH. */
export function writeTestCatalog(name: string, extend: (catalog: { providers: any[]; models: any[] }) => void): string {
  const catalog = JSON.parse(fs.readFileSync(DEFAULT_CATALOG_PATH, 'utf8'));
  extend(catalog);
  const file = path.join(stack.tmpDir, `catalog-${name}-${randomBytes(4).toString('hex')}.json`);
  fs.writeFileSync(file, JSON.stringify(catalog));
  return file;
}

/** Polls a batch until its status is one of `statuses`; fails naming where it got stuck. */
export async function waitForStatus(url: string, key: string, id: string, statuses: string[], timeoutMs = 60_000): Promise<any> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const r = await call(`${url}/api/v1/batches/${id}`, { key });
    if (r.status !== 200) throw new Error(`GET batch ${id}: ${r.status} ${JSON.stringify(r.body).slice(0, 300)}`);
    if (statuses.includes(r.body.status)) return r.body;
    if (Date.now() > deadline) throw new Error(`batch ${id} still ${r.body.status} (${JSON.stringify(r.body.request_counts)})`);
    await new Promise((res) => setTimeout(res, 150));
  }
}

/** A batch document for tests that store a batch directly: `over` sets what the test is about. */
export function testBatchDoc(t: Tenant, over: Partial<BatchDoc> & Pick<BatchDoc, 'model' | 'total'>): BatchDoc {
  const at = over.created_at ?? new Date();
  return {
    _id: newBatchId(at.getTime()),
    workspace_id: t.workspaceId,
    key_id: t.inferenceKeyId,
    endpoint: '/v1/chat/completions',
    canonical_model: `${over.model}-20260101`,
    completion_window: '24h',
    status: 'in_progress',
    created_at: at,
    in_progress_at: at,
    finalized_at: null,
    expires_at: new Date(at.getTime() + 86_400_000),
    provider_only: null,
    chunks: 0,
    chunk_starts: [],
    provider: null,
    usage: null,
    error: null,
    metadata: null,
    meta: { session_id: null, user: null, app: { referer: null, title: null, categories: [] } },
    ...over,
  };
}

/** `gateway <args>` in a process of its own (so it can be killed), once `probe` answers 2xx. */
export async function startGatewayProcess(
  name: string,
  args: string[],
  env: NodeJS.ProcessEnv,
  probe: '/readyz' | '/healthz' = '/readyz',
  timeoutMs = 60_000,
): Promise<{ proc: ManagedProcess; url: string }> {
  const port = Number(env.PORT) || (await freePort());
  const proc = startProcess(name, process.execPath, [path.join(__dirname, '..', 'cli', 'index.js'), ...args], {
    ...process.env,
    LOG_LEVEL: 'warn',
    // One API process unless a test asks for several (the default is one per core).
    API_PROCESSES: '1',
    ...env,
    PORT: String(port),
  });
  const url = `http://127.0.0.1:${port}`;
  await proc.waitUntil(
    async () => {
      if (!(await fetch(`${url}${probe}`)).ok) throw new Error('not yet');
    },
    timeoutMs,
    `answering ${probe}`,
  );
  return { proc, url };
}

/**
 * Waits until every one of a gateway's `count` API processes is up (each reports its share of the
 * requests in /metrics). /healthz answers as soon as the first one listens; a test asking that
 * they all serve a burst starts once they can.
 */
export async function allApiProcessesUp(url: string, count: number, timeoutMs = 60_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const scrape = await (await fetch(`${url}/metrics`)).text();
    if (Array.from({ length: count }, (_, i) => `gateway_api_process_requests{process="${i}"}`).every((m) => scrape.includes(m))) return;
    if (Date.now() > end) throw new Error(`not all ${count} API processes up within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/**
 * `store` with some methods of one collection replaced (a database that is slow or stopped for one
 * kind of call); everything else is the real collection.
 */
export function storeWith<C extends 'usage' | 'apiKeys' | 'rateTickets'>(
  store: Store,
  collection: C,
  replaced: (real: Collection<any>) => Record<string, (...args: any[]) => unknown>,
): Store {
  const wrap = (real: Collection<any>) => {
    const methods = replaced(real);
    return new Proxy(real, {
      get(coll, prop) {
        if (typeof prop === 'string' && prop in methods) return methods[prop];
        const v = Reflect.get(coll, prop);
        return typeof v === 'function' ? v.bind(coll) : v;
      },
    });
  };
  const s = Object.create(store) as Store;
  const member = store[collection];
  if (typeof member === 'function') {
    // A collection per argument (rate-limit blocks per period): each one wrapped.
    Object.defineProperty(s, collection, {
      value: (...args: unknown[]) => wrap((member as (...a: unknown[]) => Collection<any>).apply(store, args)),
    });
  } else {
    const proxy = wrap(member);
    Object.defineProperty(s, collection, { get: () => proxy });
  }
  return s;
}

/** Stored usage records, read back as records (they are stored packed); filter by `_id`, `workspace_id` or `batch_id`. */
export async function storedUsage(store: Store, filter: Filter<StoredUsageDoc>): Promise<UsageDoc[]> {
  return (await store.usage.find(filter).toArray()).map(fromStoredUsage);
}

/** The JSON events of a server-sent-events answer's text (`data: [DONE]` and other lines left out). */
export function sseJson(text: unknown): any[] {
  return String(text)
    .split('\n')
    .filter((l) => l.startsWith('data: {'))
    .map((l) => JSON.parse(l.slice(6)));
}

/** Runs a chat batch of one line on `model` through the gateway and returns the line's usage record once it is stored. */
export async function billedBatchLine(gw: TestGateway, key: string, model: string, body: Record<string, unknown>): Promise<UsageDoc> {
  const batch = await call(`${gw.url}/api/v1/batches`, {
    key,
    body: { endpoint: '/v1/chat/completions', model, requests: [{ custom_id: 'line', body }] },
  });
  expect(batch.status, JSON.stringify(batch.body)).to.equal(202);
  const done = await waitForStatus(gw.url, key, batch.body.id, ['completed', 'failed']);
  expect(done.request_counts).to.include({ completed: 1, failed: 0 });
  await gw.usage.flushed();
  const [line] = await storedUsage(gw.store, { batch_id: batch.body.id });
  return line;
}

/** One stored usage record, or null. */
export async function storedRecord(store: Store, id: string): Promise<UsageDoc | null> {
  const [doc] = await storedUsage(store, { _id: id });
  return doc ?? null;
}

/**
 * A chat stream whose client reads its first words and goes: the usage record it is billed, once
 * stored (its ending `client_closed`, checked).
 */
export async function streamLeftEarly(gw: TestGateway, key: string, body: Record<string, unknown>): Promise<UsageDoc> {
  const ac = new AbortController();
  const res = await fetch(`${gw.url}/api/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ ...body, stream: true }),
    signal: ac.signal,
  });
  expect(res.status).to.equal(200);
  const id = res.headers.get('x-generation-id')!;
  await res.body!.getReader().read();
  ac.abort();
  let record = null;
  for (let i = 0; i < 100 && !record; i++) {
    await gw.usage.flushed();
    record = await storedRecord(gw.store, id);
    if (!record) await new Promise((r) => setTimeout(r, 100));
  }
  expect(record, 'usage record').to.not.equal(null);
  expect(usageDetails(record!)?.ending).to.equal('client_closed');
  return record!;
}

/** The activity functions as a process builds them, on the test's own store and upstream clients. */
export function testActivities(store: Store, upstreams: Upstreams, config: Config, handoff?: DecisionHandoff) {
  return createActivities({
    store,
    upstreams,
    batchSettings: config.batches,
    usage: new UsageLedger(store),
    credits: new SpendAdmission(store),
    handoff,
  });
}

/** Batches that have input chunks stored but no batch document (a scan: tests only). Should be none. */
export async function batchesWithoutDocument(store: Store): Promise<string[]> {
  const chunks = await store.db
    .collection('batch_inputs')
    .find({}, { projection: { _id: 1 } })
    .toArray();
  const owners = [...new Set(chunks.map((d) => String(d._id).split(':')[0]))];
  const stored = await Promise.all(
    owners.map((id) => store.db.collection('batches').countDocuments({ _id: id, abandoned: { $ne: true } } as never)),
  );
  return owners.filter((_, i) => stored[i] === 0);
}

/**
 * Waits, when the rate-limit window of `windowSeconds` ends within `marginMs`, until the next one
 * has begun. Windows are aligned to the epoch: a test that counts admissions across an edge sees a
 * fresh window's tickets (one full run, at 09:00:00, admitted 217 of a limit of 200).
 */
export async function clearOfWindowEdge(windowSeconds = 3600, marginMs = 30_000): Promise<void> {
  const windowMs = windowSeconds * 1000;
  const left = windowMs - (Date.now() % windowMs);
  if (left < marginMs) await new Promise((resolve) => setTimeout(resolve, left + 50));
}
