// Listing batches from the list index: newest first with every filter, pages that read only what
// they return, stale entries skipped, deletion.
import { expect } from 'chai';
import { createBatch, deleteBatch, listBatches, purgeDeleted, writeStatus, type BatchDoc, type BatchStatus } from '../domain/batches/store';
import { packLines } from '../domain/batches/packed-lines';
import { SettledBatches } from '../domain/batches/settled-batches';
import { Store } from '../infrastructure/store';
import { stack } from './fixture';
import { createTenant, testBatchDoc, uniqueName, type Tenant } from './helpers';

const STATUSES: BatchStatus[] = ['in_progress', 'completed', 'failed', 'cancelled'];

describe('batch list index', () => {
  let store: Store;
  let t: Tenant;
  /** The workspace's batches as stored, newest first: the reference every listing is checked against. */
  let all: BatchDoc[];
  const start = Date.UTC(2026, 10, 1);

  before(async function () {
    this.timeout(120_000);
    store = await Store.connect(stack.mongoUri, uniqueName('batchlist').replace(/-/g, '_'));
    t = await createTenant(store);
    all = [];
    // 240 batches a second apart, statuses mixed; another workspace's in between.
    for (let i = 0; i < 240; i++) {
      const doc = testBatchDoc(t, { model: 'm', total: 1, status: 'validating', created_at: new Date(start + i * 1000) });
      all.push(await createBatch(store, doc, packLines([{ custom_id: 'a', body: '{}' }]), 100));
      if (i % 40 === 0) {
        const other = await createTenant(store);
        await createBatch(
          store,
          testBatchDoc(other, { model: 'm', total: 1, status: 'validating', created_at: new Date(start + i * 1000) }),
          packLines([]),
          100,
        );
      }
    }
    for (const [i, b] of all.entries()) {
      b.status = STATUSES[i % STATUSES.length];
      await writeStatus(store, b, { status: b.status });
    }
    all.reverse();
  });
  after(async () => {
    await store.close();
  });

  const ids = (docs: BatchDoc[]) => docs.map((d) => d._id);
  const list = (q: Parameters<typeof listBatches>[2]) => listBatches(store, t.workspaceId, q).then(ids);

  it('pages newest first with after, as the whole list read in order would', async () => {
    const seen: string[] = [];
    let after: string | undefined;
    for (;;) {
      const page = await list({ after, limit: 25 });
      seen.push(...page.slice(0, 25));
      if (page.length <= 25) break;
      after = page[24];
    }
    expect(seen).to.deep.equal(ids(all));
  });

  it('filters by statuses (merged newest first) and by created_after / created_before, with a cursor', async () => {
    const created = { $gt: new Date(start + 50_000), $lt: new Date(start + 200_000) };
    for (const statuses of [
      ['completed'],
      ['failed', 'in_progress'],
      ['cancelled', 'completed', 'failed'],
      ['expired'],
    ] as BatchStatus[][]) {
      const want = all.filter((b) => statuses.includes(b.status));
      expect(await list({ statuses, limit: 30 }), statuses.join()).to.deep.equal(ids(want.slice(0, 31)));
      const windowed = want.filter((b) => b.created_at > created.$gt && b.created_at < created.$lt);
      expect(await list({ statuses, created, limit: 10 })).to.deep.equal(ids(windowed.slice(0, 11)));
      if (windowed.length > 5) {
        expect(await list({ statuses, created, after: windowed[4]._id, limit: 10 })).to.deep.equal(ids(windowed.slice(5, 16)));
      }
    }
    // Bounds in whole seconds, as the API gives them: strict at both ends.
    const edge = { $gte: new Date(start + 100_000), $lt: new Date(start + 103_000) };
    expect(await list({ created: edge, limit: 10 })).to.deep.equal(
      ids(all.filter((b) => b.created_at >= edge.$gte && b.created_at < edge.$lt)),
    );
    expect(await list({ created: { $gt: new Date(start + 1e9) }, limit: 10 })).to.deep.equal([]);
  });

  it('a page reads its batches and a window of entries, not the workspace', async () => {
    const watched = await Store.connect(stack.mongoUri, store.db.databaseName, { monitorCommands: true });
    try {
      const returned: Record<string, number> = {};
      watched.client.on('commandSucceeded', (e) => {
        const batch = (e.reply as { cursor?: { firstBatch?: unknown[]; ns?: string } }).cursor;
        const coll = batch?.ns?.split('.').pop();
        if (coll) returned[coll] = (returned[coll] ?? 0) + (batch?.firstBatch?.length ?? 0);
      });
      const page = await listBatches(watched, t.workspaceId, { after: all[100]._id, statuses: ['completed'], limit: 10 });
      expect(page).to.have.length(11);
      expect(returned.batch_list).to.be.at.most(11);
      expect(returned.batches).to.be.at.most(11);
    } finally {
      await watched.close();
    }
  });

  it("a page's settled batches are read from the process the next time, the others from the store", async () => {
    const watched = await Store.connect(stack.mongoUri, store.db.databaseName, { monitorCommands: true });
    try {
      let read = 0;
      watched.client.on('commandSucceeded', (e) => {
        const batch = (e.reply as { cursor?: { firstBatch?: unknown[]; ns?: string } }).cursor;
        if (batch?.ns?.endsWith('.batches')) read += batch.firstBatch?.length ?? 0;
      });
      const settled = new SettledBatches();
      const q = { after: all[20]._id, limit: 20 };
      const first = await listBatches(watched, t.workspaceId, q, settled);
      expect(read).to.equal(21);
      read = 0;
      const again = await listBatches(watched, t.workspaceId, q, settled);
      expect(again).to.deep.equal(first);
      // Every fourth is in_progress: it can still change, so it is read each time.
      const running = first.filter((b) => b.status === 'in_progress').length;
      expect(running).to.be.within(4, 7);
      expect(read).to.equal(running);
      expect(settled.held).to.equal(21 - running);
    } finally {
      await watched.close();
    }
  });

  it('a deleted batch is not listed by a process that keeps its document', async () => {
    const settled = new SettledBatches();
    const doc = testBatchDoc(t, { model: 'm', total: 1, status: 'validating', created_at: new Date(start + 500_000) });
    const b = await createBatch(store, doc, packLines([{ custom_id: 'a', body: '{}' }]), 100);
    await writeStatus(store, b, { status: 'completed' });
    b.status = 'completed';
    expect(ids(await listBatches(store, t.workspaceId, { limit: 1 }, settled))[0]).to.equal(b._id);
    expect(settled.get(b._id)).to.not.equal(undefined);
    // Deleted, and its lines not purged yet (the entries went with the document, not with the lines).
    expect(await deleteBatch(store, b)).to.equal(true);
    expect(ids(await listBatches(store, t.workspaceId, { limit: 1 }, settled))[0]).to.equal(all[0]._id);
    while (await purgeDeleted(store)) {
      /* leave the workspace as the other tests expect it */
    }
  });

  it('skips stale entries: a status change caught half-way, another workspace, a batch gone', async () => {
    const [newest] = all;
    // The new status's entry is written first: until the document changes it is not listed there.
    const half = { ...newest, status: 'cancelling' as const };
    await store.db
      .collection<{ _id: string; batch_id: string; created_at: Date }>('batch_list')
      .insertOne({ _id: `${t.workspaceId}:cancelling:x`, batch_id: newest._id, created_at: newest.created_at });
    expect(await list({ statuses: ['cancelling'], limit: 5 })).to.deep.equal([]);
    await writeStatus(store, half, { status: 'cancelling' });
    expect(await list({ statuses: ['cancelling'], limit: 5 })).to.deep.equal([newest._id]);
    expect((await list({ statuses: [newest.status], limit: 5 }))[0]).to.not.equal(newest._id);
    await writeStatus(store, newest, { status: newest.status });
    expect(await list({ limit: 1 })).to.deep.equal([newest._id, all[1]._id]);
  });

  it('a deleted batch leaves no entry behind', async () => {
    const doc = testBatchDoc(t, { model: 'm', total: 1, status: 'validating', created_at: new Date(start - 1000) });
    const b = await createBatch(store, doc, packLines([{ custom_id: 'a', body: '{}' }]), 100);
    await writeStatus(store, b, { status: 'completed' });
    expect((await list({ limit: 300 })).slice(-1)).to.deep.equal([b._id]);
    await deleteBatch(store, b);
    expect(await list({ limit: 300 })).to.not.include(b._id);
    while (await purgeDeleted(store)) {
      /* until every deletion is done */
    }
    expect(await store.db.collection('batch_list').countDocuments({ batch_id: b._id })).to.equal(0);
  });
});
