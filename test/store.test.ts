import fs from 'node:fs';
import path from 'node:path';
import { expect } from 'chai';
import { MongoClient } from 'mongodb';
import { Store } from '../infrastructure/store';
import { freePort } from '../devstack/processes';
import { FERRETDB_GOGC, startFerretDB } from '../devstack/services';
import { stack } from './fixture';
import { createTenant, uniqueName, usageRecord } from './helpers';
import { UsageLedger, newGenerationId } from '../domain/accounts/usage-ledger';

// The design reads by `_id` wherever volume is large, because on FerretDB's SQLite backend that is
// the one lookup SQL can answer from an index. FerretDB v1.24.2 as published looked `_id` up through
// an expression its index does not cover, so every such read scanned the table; the build patches it.
describe('store: lookups by _id on the embedded FerretDB', () => {
  let store: Store;

  before(async function () {
    store = await Store.connect(stack.mongoUri, uniqueName('store'));
    const info = await store.db.admin().command({ buildInfo: 1 });
    if (!info.ferretdbVersion) this.skip(); // a real mongod (MONGODB_URI) indexes _id natively
  });
  after(async () => {
    await store?.client.close();
  });

  async function planOf(filter: Record<string, unknown>): Promise<string> {
    const res = await store.db.command({ explain: { find: store.usage.collectionName, filter, limit: 1 } });
    return JSON.stringify(res.queryPlanner);
  }

  it('a find by _id is answered from the _id index, not by scanning the collection', async () => {
    const t = await createTenant(store);
    const ledger = new UsageLedger(store);
    const ids = Array.from({ length: 50 }, () => newGenerationId());
    await Promise.all(ids.map((id) => ledger.record(usageRecord(id, t.workspaceId, t.inferenceKeyId, 0.001))));

    expect(await planOf({ _id: ids[7] })).to.match(/SEARCH \S+ USING INDEX \S+__id_/);
    // The same read through the code that serves GET /generation finds exactly that record.
    expect((await ledger.generation(t.workspaceId, ids[7]))?._id).to.equal(ids[7]);
    // Any other filter still scans (FerretDB pushes nothing else down): the contrast shows the plan is read.
    expect(await planOf({ workspace_id: t.workspaceId })).to.match(/SCAN/);
  });

  it('a filter with _id and other conditions is answered from the _id index too, and still applies the conditions', async () => {
    const t = await createTenant(store);
    const ledger = new UsageLedger(store);
    const id = newGenerationId();
    await ledger.record(usageRecord(id, t.workspaceId, t.inferenceKeyId, 0.5));
    expect(await planOf({ _id: id, workspace_id: t.workspaceId })).to.match(/SEARCH \S+ USING INDEX \S+__id_/);
    expect(await store.usage.countDocuments({ _id: id, workspace_id: t.workspaceId })).to.equal(1);
    expect(await store.usage.countDocuments({ _id: id, workspace_id: 'another' })).to.equal(0);
    // A conditional replace (the batch progress guard) writes only when its condition holds.
    const coll = store.db.collection<{ _id: string; n: number }>(uniqueName('guarded'));
    await coll.insertOne({ _id: 'p', n: 5 });
    expect((await coll.replaceOne({ _id: 'p', n: { $lte: 3 } }, { n: 3 })).matchedCount).to.equal(0);
    expect((await coll.replaceOne({ _id: 'p', $or: [{ n: { $lte: 6 } }, { n: { $exists: false } }] }, { n: 6 })).matchedCount).to.equal(1);
    expect((await coll.findOne({ _id: 'p' }))?.n).to.equal(6);
  });

  it('update commands of many statements, several at once, are answered, and so is everything after them', async function () {
    // On a FerretDB of its own: as published, v1.24.2 stopped answering altogether here (each
    // statement held a connection until its command ended); the build closes each statement's query.
    this.timeout(60_000);
    const own = await startFerretDB({
      binary: stack.tools!.ferretdb,
      port: await freePort(),
      dataDir: path.join(stack.tmpDir, uniqueName('ferret-updates')),
    });
    const client = await new MongoClient(own.address, { serverSelectionTimeoutMS: 5_000 }).connect();
    try {
      const coll = client.db('t').collection<{ _id: string; n: number }>('many');
      await coll.insertMany(Array.from({ length: 400 }, (_, i) => ({ _id: `d${i}`, n: 0 })));
      const commands = Array.from({ length: 4 }, (_, c) =>
        coll.bulkWrite(
          Array.from({ length: 100 }, (_, i) => ({ updateOne: { filter: { _id: `d${c * 100 + i}` }, update: { $set: { n: 1 } } } })),
          { ordered: false },
        ),
      );
      const outcome = await Promise.race([
        Promise.all(commands).then(() => 'answered'),
        new Promise((res) => setTimeout(() => res('hung'), 20_000)),
      ]);
      expect(outcome).to.equal('answered');
      expect(await coll.countDocuments({ n: 1 }, { maxTimeMS: 5_000 })).to.equal(400);
    } finally {
      await client.close(true);
      await own.process.stop();
    }
  });

  it('tracks no iterator, transaction or cursor for leaks (a debug-build check that cost a fifth of a small command)', async function () {
    // As published, every one of them is registered in a pprof profile of its own type, its
    // caller's stack recorded, with a finalizer that panics if it is collected unclosed. The
    // profiles show on the debug listener, off unless FERRETDB_DEBUG_ADDR is set: this FerretDB has it.
    this.timeout(60_000);
    const debugPort = await freePort();
    const own = await startFerretDB({
      binary: stack.tools!.ferretdb,
      port: await freePort(),
      dataDir: path.join(stack.tmpDir, uniqueName('ferret-untracked')),
      env: { ...process.env, FERRETDB_DEBUG_ADDR: `127.0.0.1:${debugPort}` },
    });
    const client = new MongoClient(own.address, { serverSelectionTimeoutMS: 5_000 });
    try {
      const coll = client.db('t').collection<{ _id: string }>('tracked');
      await coll.insertMany([{ _id: 'a' }, { _id: 'b' }, { _id: 'c' }]);
      expect(await coll.findOne({ _id: 'b' })).to.deep.equal({ _id: 'b' });
      expect(await coll.find({}, { batchSize: 1 }).toArray()).to.have.length(3); // a cursor over several batches
      const index = await (await fetch(`http://127.0.0.1:${debugPort}/debug/pprof/`)).text();
      expect(index).to.include('goroutine'); // the listing of profiles, read
      expect(index.match(/FerretDB\/[\w.]+/g) ?? []).to.deep.equal([]);
    } finally {
      await client.close(true);
      await own.process.stop();
    }
  });

  it('the embedded FerretDB collects garbage at GOGC 400 (a quarter less CPU a usage record), unless the environment sets GOGC', async function () {
    this.timeout(60_000);
    const { GOGC: _, ...unset } = process.env;
    const start = (env: NodeJS.ProcessEnv) =>
      freePort().then((port) =>
        startFerretDB({ binary: stack.tools!.ferretdb, port, dataDir: path.join(stack.tmpDir, uniqueName('ferret-gc')), env }),
      );
    const started = await Promise.allSettled([start(unset), start({ ...unset, GOGC: '150' })]);
    try {
      const [byDefault, bySetting] = started.map((s) => {
        if (s.status === 'rejected') throw s.reason;
        return s.value;
      });
      const gogcOf = (pid: number | undefined) =>
        fs
          .readFileSync(`/proc/${pid}/environ`, 'utf8')
          .split('\0')
          .find((v) => v.startsWith('GOGC='));
      // The command's own environment, not its watchdog's (which would pass whatever it was given).
      for (const s of [byDefault, bySetting])
        expect(fs.readFileSync(`/proc/${s.process.pid}/cmdline`, 'utf8').split('\0')[0]).to.equal(stack.tools!.ferretdb);
      expect(FERRETDB_GOGC).to.equal('400');
      expect(gogcOf(byDefault.process.pid)).to.equal('GOGC=400');
      expect(gogcOf(bySetting.process.pid)).to.equal('GOGC=150');
    } finally {
      await Promise.all(started.map((s) => s.status === 'fulfilled' && s.value.process.stop()));
    }
  });

  it('updates and deletes by _id reach the one document they name', async () => {
    const coll = store.db.collection<{ _id: string; n: number }>(uniqueName('docs'));
    await coll.insertMany(Array.from({ length: 20 }, (_, n) => ({ _id: `d${n}`, n })));
    expect((await coll.updateOne({ _id: 'd3' }, { $inc: { n: 100 } })).modifiedCount).to.equal(1);
    expect((await coll.deleteOne({ _id: 'd4' })).deletedCount).to.equal(1);
    const docs = await coll.find({}).toArray();
    expect(docs).to.have.length(19);
    expect(docs.find((d) => d._id === 'd3')?.n).to.equal(103);
    expect(docs.find((d) => d._id === 'd5')?.n).to.equal(5);
  });

  it('a range of plain strings on _id is answered from the _id index, in _id order, and exactly', async () => {
    const coll = store.db.collection<{ _id: string; n: number }>(uniqueName('ranges'));
    const ids = ['a:1', 'a:2', 'a:3', 'a:30', 'a:4', 'a;', 'a', 'a:', 'b:1', 'a:2"x', 'a:2\\', 'a:<', 'a:\u2028'];
    await coll.insertMany(ids.map((_id, n) => ({ _id, n })));
    await coll.insertOne({ _id: 7 as unknown as string, n: 99 }); // not a string: never in a string range
    async function plan(filter: Record<string, unknown>): Promise<string> {
      const res = await store.db.command({ explain: { find: coll.collectionName, filter, limit: 2 } });
      return JSON.stringify(res.queryPlanner);
    }
    expect(await plan({ _id: { $gte: 'a:', $lt: 'a:~' } })).to.match(/SEARCH \S+ USING INDEX \S+__id_ \(<expr>>\? AND <expr><\?\)/);
    expect(await plan({ _id: { $gt: 'a:2', $lte: 'a:~' }, n: { $lt: 5 } })).to.match(/USING INDEX \S+__id_/);
    // A bound holding characters JSON escapes is not pushed down: the collection is scanned, still right.
    expect(await plan({ _id: { $gte: 'a"', $lt: 'a:~' } })).to.match(/SCAN/);

    const found = async (filter: Record<string, unknown>, limit = 0) => (await coll.find(filter).limit(limit).toArray()).map((d) => d._id);
    // In _id order without a sort (the index's order), and a limit stops the walk.
    expect(await found({ _id: { $gte: 'a:', $lt: 'a:~' } })).to.deep.equal([
      'a:',
      'a:1',
      'a:2',
      'a:2"x',
      'a:2\\',
      'a:3',
      'a:30',
      'a:4',
      'a:<',
    ]);
    expect(await found({ _id: { $gt: 'a:2', $lt: 'a:~' } }, 3)).to.deep.equal(['a:2"x', 'a:2\\', 'a:3']);
    expect(await found({ _id: { $gt: 'a:1', $lte: 'a:3' } })).to.deep.equal(['a:2', 'a:2"x', 'a:2\\', 'a:3']);
    expect(await found({ _id: { $gte: 'a:3' } }, 3)).to.deep.equal(['a:3', 'a:30', 'a:4']);
    // Other conditions still apply; so does the same query through deleteMany.
    expect(await found({ _id: { $gte: 'a:', $lt: 'a:~' }, n: { $gte: 3, $lte: 4 } })).to.deep.equal(['a:30', 'a:4']);
    // A set of _ids, whatever characters they hold, is an exact lookup too.
    const set = { _id: { $in: ['a:2"x', 'a:\u2028', 'b:1', 'zz'] } };
    expect(await plan(set)).to.match(/SEARCH \S+ USING INDEX \S+__id_ \(<expr>=\?\)/);
    expect((await found(set)).sort()).to.deep.equal(['a:2"x', 'a:\u2028', 'b:1'].sort());
    expect((await coll.deleteMany({ _id: { $gte: 'a:', $lt: 'a:3' } })).deletedCount).to.equal(3 + 2); // a:, a:1, a:2 and the two escaped a:2…
    expect(await coll.countDocuments({})).to.equal(ids.length + 1 - 5);
  });
});

describe('store: indexes', () => {
  it('usage records carry no index but _id, and a database made by an earlier version loses the one it had', async () => {
    const database = uniqueName('indexes').replace(/-/g, '_');
    const first = await Store.connect(stack.mongoUri, database);
    try {
      await new UsageLedger(first).record(usageRecord(newGenerationId(), 'ws_x', 'key_x', 0.1));
      expect((await first.usage.indexes()).map((i) => i.name)).to.deep.equal(['_id_']);
      // What earlier versions created on every start.
      await first.usage.createIndex({ workspace_id: 1, created_at: -1 });
      expect(await first.usage.indexes()).to.have.length(2);
    } finally {
      await first.client.close();
    }
    const again = await Store.connect(stack.mongoUri, database);
    try {
      expect((await again.usage.indexes()).map((i) => i.name)).to.deep.equal(['_id_']);
    } finally {
      await again.client.close();
    }
  });
});
