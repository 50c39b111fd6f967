// Every query the request paths and periodic loops send is answered from the `_id` index, so its
// cost does not grow with what is stored (FerretDB reads nothing else from an index). The test
// records each filter the gateway's code gives the driver while it serves one of every kind of
// request, then asks FerretDB how it would answer it. docs/queries.md lists the queries and why
// the few that read a whole collection are bounded.
import { expect } from 'chai';
import { Collection, type Document } from 'mongodb';
import { purgeDeleted } from '../domain/batches/store';
import { LiveStats } from '../domain/routing/stats';
import { call, createTenant, startTestGateway, waitForStatus, type TestGateway } from './helpers';
import { questions, state } from './decision-sample';

/** Collections a whole read of which is bounded by design, not by what is stored (docs/queries.md). */
const BOUNDED_WHOLE = new Set([
  'batch_deletions', // deletions still in progress, a handful
  'usage_writers', // retired usage-totals writers not yet taken again: about as many as processes stopped at once
]);

type Recorded = { collection: string; op: string; filter: Document };

/** Wraps the driver's collection methods in this process (the test gateway runs here) to record filters. */
function recordQueries(): { queries: Recorded[]; restore: () => void } {
  const queries: Recorded[] = [];
  const proto = Collection.prototype as unknown as Record<string, (...args: unknown[]) => unknown>;
  const originals: Record<string, (...args: unknown[]) => unknown> = {};
  const filterOf: Record<string, (args: unknown[]) => Document[]> = {
    find: (a) => [(a[0] as Document) ?? {}],
    findOne: (a) => [(a[0] as Document) ?? {}],
    countDocuments: (a) => [(a[0] as Document) ?? {}],
    updateOne: (a) => [a[0] as Document],
    updateMany: (a) => [a[0] as Document],
    replaceOne: (a) => [a[0] as Document],
    deleteOne: (a) => [a[0] as Document],
    deleteMany: (a) => [a[0] as Document],
    findOneAndUpdate: (a) => [a[0] as Document],
    aggregate: (a) => [((a[0] as Document[])[0]?.$match as Document) ?? {}],
    bulkWrite: (a) =>
      (a[0] as Document[]).flatMap((op) => {
        const inner = Object.values(op)[0] as Document;
        return inner.filter ? [inner.filter as Document] : [];
      }),
  };
  for (const op of Object.keys(filterOf)) {
    originals[op] = proto[op];
    proto[op] = function (this: Collection, ...args: unknown[]) {
      for (const filter of filterOf[op](args)) queries.push({ collection: this.collectionName, op, filter });
      return originals[op].apply(this, args);
    };
  }
  return {
    queries,
    restore: () => {
      for (const op of Object.keys(originals)) proto[op] = originals[op];
    },
  };
}

describe('bounded queries: every request path and periodic loop reads by _id', function () {
  this.timeout(120_000);
  let gw: TestGateway;
  let recorder: ReturnType<typeof recordQueries>;

  before(async function () {
    gw = await startTestGateway({ env: { METRICS_TOKEN: 'scrape', WEBHOOKS_ALLOW_PRIVATE_URLS: 'true' } });
    const info = await gw.store.db.admin().command({ buildInfo: 1 });
    if (!info.ferretdbVersion) this.skip(); // the plans below are FerretDB's
  });
  after(async () => {
    recorder?.restore();
    await gw?.stop();
  });

  it('serves one of every request, and FerretDB answers each of its filters from the _id index', async () => {
    const t = await createTenant(gw.store, 10);
    recorder = recordQueries();
    const api = (path: string, opts: Parameters<typeof call>[1] = {}) => call(`${gw.url}/api/v1${path}`, { key: t.inferenceKey, ...opts });
    const manage = (path: string, opts: Parameters<typeof call>[1] = {}) => api(path, { key: t.managementKey, ...opts });
    const ok = (r: { status: number; body: unknown }, what: string) =>
      expect(r.status, `${what}: ${JSON.stringify(r.body)}`).to.be.below(300);

    const chat = { model: 'sandbox/chat-1', messages: [{ role: 'user', content: 'hi' }] };
    const completion = await api('/chat/completions', { body: chat });
    ok(completion, 'chat');
    ok(await api('/chat/completions', { body: { ...chat, stream: true } }), 'stream');
    ok(await api('/systemone', { body: { model: 'jev-1.13', state, questions } }), 'decision');
    ok(await api('/credits'), 'credits');
    ok(await api('/key'), 'key');
    await gw.usage.flushed();
    ok(await api(`/generation?id=${completion.headers.get('x-generation-id')}`), 'generation');
    ok(await manage('/presets/bounded/messages', { body: { ...chat, system: 'be brief' } }), 'preset create');
    ok(await manage('/presets/bounded/messages', { body: { ...chat, system: 'be briefer' } }), 'preset version');
    ok(await api('/chat/completions', { body: { ...chat, model: '@preset/bounded' } }), 'preset use');
    ok(await api('/presets'), 'presets list');
    ok(await api('/presets/bounded'), 'preset get');
    ok(await api('/presets/bounded/versions?offset=1'), 'preset versions');
    ok(await api('/presets/bounded/versions/1'), 'preset version get');
    const key = await manage('/keys', { body: { name: 'extra' } });
    ok(key, 'key create');
    ok(await manage('/keys'), 'keys list');
    ok(await manage(`/keys/${key.body.data.id}`), 'key get');
    ok(await manage(`/keys/${key.body.data.id}`, { method: 'DELETE' }), 'key revoke');
    ok(await manage('/webhooks/secret'), 'webhook secret');
    // A trace destination that receives nothing (the discard port): its exports fail off the request path.
    const destination = await manage('/trace-destinations', { body: { endpoint: 'http://127.0.0.1:9/v1/traces' } });
    ok(destination, 'trace destination add');
    ok(await manage('/trace-destinations'), 'trace destinations list');
    ok(await manage(`/trace-destinations/${destination.body.data.id}`, { method: 'DELETE' }), 'trace destination remove');
    ok(await api('/models'), 'models');

    const created = await api('/batches', {
      body: { endpoint: '/v1/chat/completions', model: 'sandbox/chat-1', requests: [{ custom_id: 'a', body: chat }] },
    });
    ok(created, 'batch create');
    const id = created.body.id as string;
    await waitForStatus(gw.url, t.inferenceKey, id, ['completed']);
    ok(await api(`/batches/${id}`), 'batch get');
    ok(await api(`/batches/${id}/results`), 'batch results');
    ok(await api('/batches?limit=5&status=completed&status=failed'), 'batch list');
    ok(await api(`/batches?limit=5&after=${id}&created_after=1`), 'batch list with a cursor');
    const other = await api('/batches', {
      body: { endpoint: '/v1/chat/completions', model: 'sandbox/chat-1', requests: [{ custom_id: 'b', body: chat }] },
    });
    ok(await api(`/batches/${other.body.id}/cancel`, { method: 'POST' }), 'batch cancel');
    await waitForStatus(gw.url, t.inferenceKey, other.body.id, ['cancelled', 'completed']);
    ok(await api(`/batches/${id}`, { method: 'DELETE' }), 'batch delete');
    // The periodic loops: deletion sweeps and routing statistics (flush and refresh).
    await purgeDeleted(gw.store);
    const stats = new LiveStats(gw.store);
    stats.record('sandbox/chat-1', { ok: true, latencyMs: 12, outputTokens: 3 });
    await stats.flush();
    await stats.refresh();
    expect(stats.snapshot().get('sandbox/chat-1')?.requests).to.equal(1);
    ok(
      await fetch(`${gw.url}/metrics`, { headers: { authorization: 'Bearer scrape' } }).then((r) => ({ status: r.status, body: null })),
      'metrics',
    );
    recorder.restore();

    // Each distinct query (collection and filter shape), explained by FerretDB.
    const shapes = new Map<string, Recorded>();
    for (const q of recorder.queries) {
      if (q.collection.startsWith('system.')) continue;
      shapes.set(`${q.collection} ${q.op} ${shape(q.filter)}`, q);
    }
    const scans: string[] = [];
    for (const [key, q] of shapes) {
      if (!Object.keys(q.filter).length && BOUNDED_WHOLE.has(q.collection)) continue;
      const plan = await gw.store.db.command({ explain: { find: q.collection, filter: q.filter } });
      if (!plan.filterPushdown) scans.push(key);
    }
    expect(shapes.size, 'the scenario reached the database').to.be.greaterThan(20);
    expect(scans, 'queries FerretDB answers by reading the whole collection').to.deep.equal([]);
  });
});

/** A filter with its values replaced by their types: one entry per kind of query. */
function shape(v: unknown): string {
  if (Array.isArray(v)) return `[${v.length ? shape(v[0]) : ''}]`;
  if (v instanceof Date) return 'date';
  if (v && typeof v === 'object') {
    return `{${Object.entries(v)
      .map(([k, x]) => `${k}:${shape(x)}`)
      .join(',')}}`;
  }
  return typeof v;
}
