// A workspace's storage quota (WORKSPACE_STORAGE_BYTES): batch inputs, preset versions and keys are
// counted once stored (batches taken off once deleted), per writer, summed over writers.
import { expect } from 'chai';
import {
  batchesWithoutDocument,
  call,
  createTenant,
  testBatchDoc,
  startTestGateway,
  waitForStatus,
  type Tenant,
  type TestGateway,
} from './helpers';
import { BSON } from 'mongodb';
import { StorageQuota } from '../domain/accounts/storage-quota';
import { KEY_STORED_BYTES } from '../domain/accounts/keys';
import { createBatch as storeBatch, deleteBatch } from '../domain/batches/store';
import { Store } from '../infrastructure/store';
import { stack } from './fixture';
import { storedSize, packLines } from '../domain/batches/packed-lines';
import { sizeText } from '../infrastructure/errors/sizes';

describe('storage quota', () => {
  let gw: TestGateway;
  let t: Tenant;
  const QUOTA = 40_000;
  const requests = (n: number, pad: number) =>
    Array.from({ length: n }, (_, i) => ({
      custom_id: `r-${i}`,
      body: { messages: [{ role: 'user', content: `${i} ${'x'.repeat(pad)}` }] },
    }));
  /** What the lines of `reqs` take once stored, as the gateway counts them. */
  const sizeOf = (reqs: ReturnType<typeof requests>) =>
    storedSize(packLines(reqs.map((r) => ({ custom_id: r.custom_id, body: JSON.stringify(r.body) }))));
  const createBatch = (key: string, reqs: ReturnType<typeof requests>) =>
    call(`${gw.url}/api/v1/batches`, { key, body: { endpoint: '/v1/chat/completions', model: 'sandbox/chat-1', requests: reqs } });
  const stored = (workspaceId: string) => new StorageQuota(gw.store, QUOTA).stored(workspaceId);

  before(async () => {
    gw = await startTestGateway({ env: { WORKSPACE_STORAGE_BYTES: String(QUOTA) } });
    t = await createTenant(gw.store, 5);
  });
  after(async () => gw.stop());

  it("counts a batch's lines and a preset version's config; past the quota a 402 stores nothing; a deleted batch makes room; other workspaces are not touched", async function () {
    this.timeout(120_000);
    const first = requests(20, 1_000);
    const created = await createBatch(t.managementKey, first);
    expect(created.status, JSON.stringify(created.body)).to.equal(202);
    expect(await stored(t.workspaceId)).to.equal(sizeOf(first));

    const preset = await call(`${gw.url}/api/v1/presets/p/chat/completions`, {
      key: t.managementKey,
      body: { model: 'sandbox/chat-1', temperature: 0.5 },
    });
    expect(preset.status).to.equal(200);
    const withPreset = await stored(t.workspaceId);
    expect(withPreset - sizeOf(first)).to.equal(JSON.stringify({ model: 'sandbox/chat-1', temperature: 0.5 }).length);

    // 20 KB more lines than fit.
    const second = requests(20, 1_000);
    const refused = await createBatch(t.managementKey, second);
    expect(refused.status).to.equal(402);
    // Sizes as they are: a quota of 40,000 bytes read "0.0 MB" before.
    expect(refused.body.error.message).to.equal(
      `This workspace stores ${sizeText(withPreset)} of batch inputs, preset versions and keys, of the 39.1 KB it may store, and this needs ${sizeText(sizeOf(second))} more: delete batches or presets it no longer needs`,
    );
    expect(refused.body.error.message).to.match(/stores \d+(\.\d+)? KB .* needs \d+(\.\d+)? KB more/);
    expect(refused.body.error.metadata).to.deep.equal({ stored_bytes: withPreset, adding_bytes: sizeOf(second), quota_bytes: QUOTA });
    const listed = await call(`${gw.url}/api/v1/batches`, { key: t.managementKey });
    expect(listed.body.data.map((b: { id: string }) => b.id)).to.deep.equal([created.body.id]);
    expect(await stored(t.workspaceId)).to.equal(withPreset);
    const shown = await call(`${gw.url}/api/v1/storage`, { key: t.inferenceKey });
    expect(shown.body).to.deep.equal({ data: { stored_bytes: withPreset, quota_bytes: QUOTA } });
    // Its lines were stored while the quota was read, and removed with the refusal.
    expect(await batchesWithoutDocument(gw.store)).to.deep.equal([]);

    // The system prompt is stored, as the version's `system_prompt`.
    const bigPreset = await call(`${gw.url}/api/v1/presets/p/messages`, {
      key: t.managementKey,
      body: { model: 'sandbox/chat-1', max_tokens: 10, system: 'y'.repeat(QUOTA), messages: [] },
    });
    expect(bigPreset.status).to.equal(402);
    expect(bigPreset.body.error.metadata.quota_bytes).to.equal(QUOTA);
    const versions = await call(`${gw.url}/api/v1/presets/p/versions`, { key: t.managementKey });
    expect(versions.body.data).to.have.length(1);

    // Another workspace stores its own.
    const other = await createTenant(gw.store, 5);
    expect((await createBatch(other.managementKey, second)).status).to.equal(202);
    expect(await stored(other.workspaceId)).to.equal(sizeOf(second));

    await waitForStatus(gw.url, t.managementKey, created.body.id, ['completed']);
    const deleted = await call(`${gw.url}/api/v1/batches/${created.body.id}`, { method: 'DELETE', key: t.managementKey });
    expect(deleted.status).to.equal(200);
    expect(await stored(t.workspaceId)).to.equal(withPreset - sizeOf(first));
    // Deleted twice: taken off once (the second finds no batch).
    expect((await call(`${gw.url}/api/v1/batches/${created.body.id}`, { method: 'DELETE', key: t.managementKey })).status).to.equal(404);
    expect(await stored(t.workspaceId)).to.equal(withPreset - sizeOf(first));
    expect((await createBatch(t.managementKey, second)).status).to.equal(202);
  });

  it('a workspace at its quota is refused: before a body over 1 MB is read, after a small one is', async () => {
    const full = await createTenant(gw.store, 5);
    const q = new StorageQuota(gw.store, QUOTA);
    await q.add(full.workspaceId, QUOTA);
    const small = await createBatch(full.managementKey, requests(1, 10));
    expect(small.status).to.equal(402);
    expect(small.headers.get('connection')).to.equal('keep-alive');
    const large = await createBatch(full.managementKey, requests(1, 1_100_000));
    expect(large.status).to.equal(402);
    expect(large.body.error.metadata).to.deep.equal({ stored_bytes: QUOTA, adding_bytes: 1, quota_bytes: QUOTA });
    expect(large.headers.get('connection')).to.equal('close');
    await q.close();
  });

  it('a key made counts what a key takes stored; at the quota a key create is a 402 and makes no key', async () => {
    const ws = await createTenant(gw.store, 5);
    const keys = async () => (await call(`${gw.url}/api/v1/keys`, { key: ws.managementKey })).body.data.length;
    const before = await keys();
    const made = await call(`${gw.url}/api/v1/keys`, { key: ws.managementKey, body: { name: 'n'.repeat(100) } });
    expect(made.status).to.equal(201);
    expect(await stored(ws.workspaceId)).to.equal(KEY_STORED_BYTES);
    // The largest key as stored (a 100-character name) within what is counted for it.
    const doc = await gw.store.apiKeys.findOne({ id: made.body.data.id });
    const entry = await gw.store.db.collection('workspace_keys').findOne({ _id: `${ws.workspaceId}:${made.body.data.id}` as never });
    expect(BSON.calculateObjectSize(doc!) + BSON.calculateObjectSize(entry!)).to.be.within(400, KEY_STORED_BYTES);

    const q = new StorageQuota(gw.store, QUOTA);
    await q.add(ws.workspaceId, QUOTA - KEY_STORED_BYTES);
    await q.close();
    await new Promise((r) => setTimeout(r, 1_100)); // the gateway's total, read at the first create, answers for a second
    const refused = await call(`${gw.url}/api/v1/keys`, { key: ws.managementKey, body: { name: 'one too many' } });
    expect(refused.status).to.equal(402);
    expect(refused.body.error.metadata).to.deep.equal({ stored_bytes: QUOTA, adding_bytes: KEY_STORED_BYTES, quota_bytes: QUOTA });
    expect(await keys()).to.equal(before + 1);
  });

  it("reads a workspace's total at most once a second, with this process's own counts added meanwhile", async () => {
    const ws = `ws_fresh_${Date.now()}`;
    let now = 1_000_000;
    const mine = new StorageQuota(gw.store, QUOTA, undefined, () => now);
    const other = new StorageQuota(gw.store, QUOTA);
    expect(await mine.stored(ws)).to.equal(0);
    await other.add(ws, 500); // another process
    await mine.add(ws, 20);
    now += 999;
    expect(await mine.stored(ws)).to.equal(20);
    now += 1;
    expect(await mine.stored(ws)).to.equal(520);
    await Promise.all([mine.close(), other.close()]);
  });

  it('of two deletions of one batch at once, one deletes it (and so takes its size off)', async () => {
    const doc = testBatchDoc(t, { model: 'sandbox/chat-1', total: 1 });
    const b = await storeBatch(gw.store, doc, packLines([{ custom_id: 'a', body: '{}' }]), 100);
    expect(await Promise.all([deleteBatch(gw.store, b), deleteBatch(gw.store, b)])).to.have.members([true, false]);
  });

  it('sums what each writer counted; one writer counts concurrent adds once each, and is taken over after it closes', async () => {
    const ws = `ws_quota_${Date.now()}`;
    const watched = await Store.connect(stack.mongoUri, gw.store.db.databaseName, { monitorCommands: true });
    const writes: string[] = [];
    watched.client.on('commandStarted', (e) => {
      if (e.commandName === 'update' && e.command.update === 'stored_bytes') writes.push(e.commandName);
    });
    const a = new StorageQuota(watched, QUOTA);
    const b = new StorageQuota(gw.store, QUOTA);
    await Promise.all([...Array.from({ length: 200 }, () => a.add(ws, 3)), b.add(ws, 1_000), b.add(ws, -400)]);
    expect(await a.stored(ws)).to.equal(600 + 600);
    // All 200 came before the first write began: one write, not 200.
    expect(writes).to.have.length(1);
    const docs = async () => gw.store.db.collection('stored_bytes').countDocuments({ workspace_id: ws });
    expect(await docs()).to.equal(2);
    await a.close();
    await b.close();
    await watched.close();
    // The next writers go on with the pooled ones' documents: no document more.
    const c = new StorageQuota(gw.store, QUOTA);
    const d = new StorageQuota(gw.store, QUOTA);
    await Promise.all([c.add(ws, 7), d.add(ws, 11)]);
    expect(await c.stored(ws)).to.equal(1_200 + 18);
    expect(await docs()).to.equal(2);
    await Promise.all([c.close(), d.close()]);
  });
});
