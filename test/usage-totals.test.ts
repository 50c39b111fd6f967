// The balance from running totals: exact (never a record twice, never one missed, across crashes,
// failed inserts and retried generations), read by `_id` only.
import { expect } from 'chai';
import { getBalance } from '../domain/accounts/credits';
import { UsageLedger } from '../domain/accounts/usage-ledger';
import { TotalsWriter, usageTotals } from '../domain/accounts/usage-totals';
import { Store, workspaceRange, type UsageDoc } from '../infrastructure/store';
import { toStoredUsage, type StoredUsageDoc } from '../infrastructure/store/usage-form';
import { stack } from './fixture';
import { createTenant, storeWith, uniqueName, usageRecord, type Tenant } from './helpers';

describe('usage totals: the balance in bounded reads', () => {
  let store: Store;
  let t: Tenant;
  const doc = (id: string, cost: number, ws = t.workspaceId) =>
    ({ ...usageRecord(id, ws, t.inferenceKeyId, cost), created_at: new Date() }) as UsageDoc;
  const usage = async (ws = t.workspaceId) => (await getBalance(store, ws)).total_usage;

  before(async () => {
    store = await Store.connect(stack.mongoUri, uniqueName('totals').replace(/-/g, '_'));
  });
  beforeEach(async () => {
    t = await createTenant(store, 100);
  });
  after(async () => {
    await store.close();
  });
  /** The workspace's totals once no document names a pending group (writers settle after a second idle). */
  async function settledTotals(workspaceId: string) {
    for (let i = 0; i < 40; i++) {
      const docs = await usageTotals(store)
        .find({ _id: workspaceRange(workspaceId) })
        .toArray();
      if (docs.every((d) => d.pending === null)) return docs;
      await new Promise((r) => setTimeout(r, 100));
    }
    throw new Error('totals still pending after 4 s');
  }

  it('sums what every writer stored, each record once, a generation recorded by two writers included', async () => {
    const [one, two] = [new UsageLedger(store), new UsageLedger(store)];
    const ids = Array.from({ length: 300 }, (_, i) => `gen-totals-${t.workspaceId}-${i}`);
    // Both ledgers record every generation at once: each is stored (and billed) once.
    const outcomes = await Promise.all(
      ids.flatMap((id, i) => [
        one.record(usageRecord(id, t.workspaceId, t.inferenceKeyId, 0.001 * (i % 7))),
        two.record(usageRecord(id, t.workspaceId, t.inferenceKeyId, 0.001 * (i % 7))),
      ]),
    );
    expect(outcomes.filter(Boolean)).to.have.length(ids.length);
    const expected = ids.reduce((sum, _, i) => sum + 0.001 * (i % 7), 0);
    expect(await usage()).to.be.closeTo(expected, 1e-9);
    expect(await store.usage.countDocuments({ workspace_id: t.workspaceId })).to.equal(ids.length);
    // One totals document per writer, nothing pending once they have been idle a moment.
    const totals = await settledTotals(t.workspaceId);
    expect(totals.map((d) => d.writer).sort()).to.deep.equal([one['totals'].id, two['totals'].id].sort());
    expect((await getBalance(store, t.workspaceId)).balance).to.be.closeTo(100 - expected, 1e-9);
  });

  it('a writer that stops between announcing a group and finishing it: the records it stored count, once', async () => {
    const dead = new TotalsWriter(store);
    const docs = [doc('gen-crash-1', 0.5), doc('gen-crash-2', 0.25), doc('gen-crash-3', 0.125)];
    await dead.begin(docs);
    await store.usage.insertMany(docs.slice(0, 2).map(toStoredUsage)); // the third never got in; the writer is gone
    expect(await usage()).to.equal(0.75);
    // The next process re-inserts the whole group from its journal: only the third is new.
    const next = new UsageLedger(store);
    for (const d of docs) await next.record(usageRecord(d._id, t.workspaceId, t.inferenceKeyId, d.cost));
    await next.flushed();
    expect(await usage()).to.equal(0.875);
  });

  it("names a pending group's ids as one text field, and still reads a pending list written by an earlier version", async () => {
    const writer = new TotalsWriter(store);
    const docs = [doc('gen-text-1', 0.5), doc('gen-text-2', 0.25)];
    await writer.begin(docs);
    const [written] = await usageTotals(store)
      .find({ _id: `${t.workspaceId}:${writer.id}` })
      .toArray();
    expect(written.pending!.ids).to.be.a('string');
    expect(JSON.parse(written.pending!.ids as string)).to.deep.equal(['gen-text-1', 'gen-text-2']);
    await store.usage.insertMany(docs.slice(0, 1).map(toStoredUsage));
    expect(await usage()).to.equal(0.5);

    // An earlier version's documents: the ids as a list, its records with every field at the top.
    const old = [
      { ...doc('gen-list-1', 0.125), writer: 'w-old', group: 3 },
      { ...doc('gen-list-2', 2), writer: 'w-old', group: 3 },
    ];
    await usageTotals(store).insertOne({
      _id: `${t.workspaceId}:w-old`,
      workspace_id: t.workspaceId,
      writer: 'w-old',
      cost: 1,
      pending: { group: 3, ids: old.map((d) => d._id) },
      updated_at: new Date(),
    });
    await store.usage.insertMany(old.slice(0, 1));
    expect(await usage()).to.equal(0.5 + 1 + 0.125);
  });

  it('a group whose insert failed part-way is counted by what it stored, before the next group', async () => {
    let fail = true;
    const flaky = storeWith(store, 'usage', (real) => ({
      insertMany: async (docs: StoredUsageDoc[], opts: object) => {
        if (!fail) return real.insertMany(docs, opts);
        fail = false;
        await real.insertMany(docs.slice(0, 1), opts);
        throw new Error('connection reset'); // the answer was lost; one record got in
      },
    }));
    const ledger = new UsageLedger(flaky);
    const refused = await ledger.record(usageRecord('gen-flaky-1', t.workspaceId, t.inferenceKeyId, 0.5)).catch((err: Error) => err);
    expect(refused).to.be.instanceOf(Error);
    // Nothing is settled yet: the totals still name the group, and a reader counts its stored record.
    expect(await usage()).to.equal(0.5);
    await ledger.record(usageRecord('gen-flaky-2', t.workspaceId, t.inferenceKeyId, 0.25));
    await ledger.flushed();
    expect(await usage()).to.equal(0.75);
    const [total] = await settledTotals(t.workspaceId);
    expect(total).to.include({ cost: 0.75, pending: null });
    // The caller retries the refused one: already stored, not billed again.
    expect(await ledger.record(usageRecord('gen-flaky-1', t.workspaceId, t.inferenceKeyId, 0.5))).to.equal(false);
    expect(await usage()).to.equal(0.75);
  });

  it('is read by _id: grants and totals are _id ranges, pending records an _id set, whatever the ledger holds', async function () {
    const info = await store.db.admin().command({ buildInfo: 1 });
    if (!info.ferretdbVersion) this.skip();
    const explain = async (collection: string, filter: object) =>
      (await store.db.command({ explain: { find: collection, filter } })) as { filterPushdown?: boolean; queryPlanner: unknown };
    for (const [coll, filter] of [
      ['credit_grants', { _id: workspaceRange(t.workspaceId) }],
      ['usage_totals', { _id: workspaceRange(t.workspaceId) }],
      ['usage', { _id: { $in: ['gen-a', 'gen-b'] } }],
    ] as const) {
      const plan = await explain(coll, filter);
      expect(plan.filterPushdown, coll).to.equal(true);
      expect(JSON.stringify(plan.queryPlanner), coll).to.match(/USING INDEX \S+__id_/);
    }
  });
});
