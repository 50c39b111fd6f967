// The balance from running totals: exact (never a record twice, never one missed, across crashes,
// failed inserts and retried generations), read by `_id` only.
import { expect } from 'chai';
import { Collection } from 'mongodb';
import { getBalance } from '../domain/accounts/credits';
import { UsageLedger } from '../domain/accounts/usage-ledger';
import { retiredWriters, TotalsWriter, usageTotals } from '../domain/accounts/usage-totals';
import { Store, workspaceRange, type UsageDoc } from '../infrastructure/store';
import { fromStoredUsage, toStoredUsage, type StoredUsageDoc } from '../infrastructure/store/usage-form';
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

  it('a writer forgets workspaces it has not billed lately, and reads a forgotten one back before rewriting its total', async () => {
    let now = 0;
    const writer = new TotalsWriter(store, { idleMs: 1_000, now: () => now });
    const group = async (docs: UsageDoc[]) => {
      await writer.begin(docs);
      await store.usage.insertMany(docs.map(toStoredUsage));
      writer.inserted(
        docs,
        docs.map(() => 'inserted' as const),
      );
      await writer.settle();
    };
    await group([doc(`gen-forget-${t.workspaceId}-1`, 0.5), doc(`gen-forget-${t.workspaceId}-2`, 0.25)]);
    // Many other workspaces come and go, one group each, a second apart.
    let most = 0;
    for (let i = 0; i < 40; i++) {
      now += 1_500;
      const other = `${uniqueName('ws')}`;
      await group([doc(`gen-forget-${other}`, 0.01, other)]);
      most = Math.max(most, writer['stored'].size);
    }
    expect(most, 'workspaces held in memory').to.be.at.most(3);
    expect(writer['stored'].peek(t.workspaceId), 'forgotten').to.equal(undefined);
    // Billed again: its document keeps what it held (read back), plus the new record.
    now += 1_500;
    await group([doc(`gen-forget-${t.workspaceId}-3`, 0.125)]);
    const [total] = await settledTotals(t.workspaceId);
    expect(total).to.include({ writer: writer.id, cost: 0.875, pending: null });
    expect(await usage()).to.equal(0.875);
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

  describe('writers outlive their processes', () => {
    // Each in a database of its own: the pool of retired writers is per database.
    let db: Store;
    let ws: Tenant;
    beforeEach(async () => {
      db = await Store.connect(stack.mongoUri, uniqueName('writers').replace(/-/g, '_'));
      ws = await createTenant(db, 100);
    });
    afterEach(async () => {
      await db.close();
    });
    const totalsOf = (workspaceId: string) =>
      usageTotals(db)
        .find({ _id: workspaceRange(workspaceId) })
        .toArray();
    const record = (ledger: UsageLedger, id: string, cost: number, workspaceId = ws.workspaceId) =>
      ledger.recordStored(usageRecord(id, workspaceId, ws.inferenceKeyId, cost));

    it('a ledger closed with everything stored hands its writer to the next: ten restarts leave one totals document, the balance exact', async () => {
      let expected = 0;
      const writers = new Set<string>();
      const groups: number[][] = [];
      for (let round = 0; round < 10; round++) {
        const ledger = new UsageLedger(db);
        const ids = Array.from({ length: 5 }, (_, i) => `gen-restart-${ws.workspaceId}-${round}-${i}`);
        for (const [i, id] of ids.entries()) {
          expect(await record(ledger, id, 0.001 * (round + i + 1))).to.equal(true);
          expected += 0.001 * (round + i + 1);
        }
        writers.add(ledger['totals'].id);
        await ledger.close(5_000);
        expect((await getBalance(db, ws.workspaceId)).total_usage).to.be.closeTo(expected, 1e-9);
        const totals = await totalsOf(ws.workspaceId);
        expect(totals, `round ${round}`).to.have.length(1);
        expect(totals[0]).to.include({ pending: null });
        expect(totals[0].cost).to.be.closeTo(expected, 1e-9);
        const stored = (await db.usage.find({ _id: { $in: ids } }).toArray()).map(fromStoredUsage);
        groups.push(stored.map((d) => d.group!));
      }
      expect(writers.size).to.equal(1);
      // Each owner goes on from the groups its predecessor stamped: a stamp never repeats.
      for (let r = 1; r < groups.length; r++) expect(Math.min(...groups[r])).to.be.greaterThan(Math.max(...groups[r - 1]));
    });

    it('ledgers started and closed together never share a writer; a workspace has as many documents as ledgers ran at once', async () => {
      const other = await createTenant(db, 100);
      let expected = 0;
      const seen = new Set<string>();
      for (let round = 0; round < 4; round++) {
        const ledgers = Array.from({ length: 4 }, () => new UsageLedger(db));
        await Promise.all(
          ledgers.flatMap((ledger, l) =>
            [ws.workspaceId, other.workspaceId].flatMap((workspaceId) =>
              Array.from({ length: 10 }, (_, i) => record(ledger, `gen-together-${workspaceId}-${round}-${l}-${i}`, 0.01, workspaceId)),
            ),
          ),
        );
        expected += 4 * 10 * 0.01;
        const ids = ledgers.map((l) => l['totals'].id);
        expect(new Set(ids).size, ids.join(' ')).to.equal(4);
        for (const id of ids) seen.add(id);
        await Promise.all(ledgers.map((l) => l.close(5_000)));
        for (const workspaceId of [ws.workspaceId, other.workspaceId]) {
          expect(await totalsOf(workspaceId)).to.have.length(4);
          expect((await getBalance(db, workspaceId)).total_usage).to.be.closeTo(expected, 1e-9);
        }
      }
      expect(seen.size).to.equal(4);
    });

    it('a group of records from 300 workspaces is stored and counted, and the database keeps answering', async () => {
      // Its totals are one update per workspace: sent as one command, FerretDB as published stopped answering.
      const tenants = await Promise.all(Array.from({ length: 300 }, () => createTenant(db, 1)));
      const ledger = new UsageLedger(db);
      // The totals' update commands, by how many statements each carries.
      const commands: number[] = [];
      const proto = Collection.prototype as unknown as { bulkWrite: (...args: unknown[]) => unknown };
      const bulkWrite = proto.bulkWrite;
      proto.bulkWrite = function (this: Collection, ...args: unknown[]) {
        if (this.collectionName === 'usage_totals') commands.push((args[0] as unknown[]).length);
        return bulkWrite.apply(this, args);
      };
      try {
        const outcomes = await Promise.all(
          tenants.map((t, i) => record(ledger, `gen-wide-${t.workspaceId}`, 0.001 * (i + 1), t.workspaceId)),
        );
        expect(outcomes.every(Boolean)).to.equal(true);
        await ledger.close(5_000);
      } finally {
        proto.bulkWrite = bulkWrite;
      }
      expect(commands.reduce((a, b) => a + b, 0)).to.be.at.least(300);
      // On FerretDB in parts small enough for one as published (on MongoDB, one command each time).
      if (db.ferretdb) expect(Math.max(...commands)).to.be.at.most(16);
      for (const i of [0, 149, 299])
        expect((await getBalance(db, tenants[i].workspaceId)).total_usage).to.be.closeTo(0.001 * (i + 1), 1e-9);
    });

    it('a ledger closing against a database that stops answering gives up after its grace', async () => {
      // The pool's insert never answers, as with a database that accepts and never replies.
      const silent = Object.create(db) as Store;
      const writers = new Proxy(retiredWriters(db), {
        get: (coll, prop) => (prop === 'insertOne' ? () => new Promise(() => undefined) : Reflect.get(coll, prop)),
      });
      Object.defineProperty(silent, 'db', {
        get: () =>
          new Proxy(db.db, {
            get: (d, prop) =>
              prop === 'collection' ? (name: string) => (name === 'usage_writers' ? writers : d.collection(name)) : Reflect.get(d, prop),
          }),
      });
      const ledger = new UsageLedger(silent);
      expect(await record(ledger, `gen-silent-${ws.workspaceId}`, 0.5)).to.equal(true);
      const started = Date.now();
      await ledger.close(300);
      expect(Date.now() - started).to.be.within(250, 2_000);
      expect((await getBalance(db, ws.workspaceId)).total_usage).to.equal(0.5);
    });

    it('a ledger closed before its records are stored keeps its writer out of the pool, and every stored record counts', async () => {
      const ledger = new UsageLedger(db);
      await record(ledger, `gen-first-${ws.workspaceId}`, 0.5); // the writer's id is settled by its first write
      const ids = Array.from({ length: 300 }, (_, i) => `gen-cut-${ws.workspaceId}-${i}`);
      const outcomes = ids.map((id) => record(ledger, id, 0.001).catch((err: Error) => err));
      await ledger.close(0);
      await Promise.all(outcomes);
      expect(await retiredWriters(db).countDocuments({ _id: ledger['totals'].id })).to.equal(0);
      const next = new UsageLedger(db);
      await record(next, `gen-next-${ws.workspaceId}`, 0.25);
      expect(next['totals'].id).to.not.equal(ledger['totals'].id);
      await ledger.flushed(); // the write in flight at close ends (its callers were told already)
      expect(await retiredWriters(db).countDocuments({ _id: ledger['totals'].id })).to.equal(0);
      const stored = (
        await db.usage.find({ _id: { $in: [...ids, `gen-first-${ws.workspaceId}`, `gen-next-${ws.workspaceId}`] } }).toArray()
      ).map(fromStoredUsage);
      await next.close(5_000);
      expect((await getBalance(db, ws.workspaceId)).total_usage).to.be.closeTo(
        stored.reduce((sum, d) => sum + d.cost, 0),
        1e-9,
      );
    });
  });
});
