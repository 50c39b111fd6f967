// The chunk activity on its own (Temporal's MockActivityEnvironment, real database and sandbox):
// where a retried chunk resumes, that counts never go backwards, and that a line naming a missing
// preset fails alone.
import { expect } from 'chai';
import { MockActivityEnvironment } from '@temporalio/testing';
import { CancelledFailure } from '@temporalio/common';
import { loadConfig } from '../infrastructure/config';
import { Store } from '../infrastructure/store';
import { createUpstreams } from '../domain/routing/upstreams';
import { UsageLedger } from '../domain/accounts/usage-ledger';
import { SpendAdmission } from '../domain/accounts/spend-admission';
import { batches, createBatch, newBatchId, readBatch, writeStatus } from '../domain/batches/store';
import { pages, resultTexts, type ResultDoc } from '../domain/batches/results';
import { readProgress, saveProgress, emptyTally } from '../domain/batches/progress';
import { seqId } from '../domain/batches/placement';
import { storeInputs } from '../domain/batches/inputs';
import { packLines } from '../domain/batches/packed-lines';
import { stack } from './fixture';
import { addPresetVersion } from '../domain/presets/store';
import { ChunkWriter } from '../domain/batches/chunk-writer';
import { LiveCounts } from '../domain/batches/live-counts';
import { PageCache } from '../domain/batches/page-cache';
import { unpackPage } from '../domain/batches/page-form';
import { LineRunner } from '../domain/batches/line-runner';
import { createTenant, testActivities, testBatchDoc, uniqueName, writeTestCatalog, type Tenant } from './helpers';
import { roundUsd } from '../domain/catalog/usd';
import { endpointEntry, modelEntry, providerEntry } from '../domain/catalog/entries';
import { until } from './until';

/** Calls the sandbox received for a tag (or, with `_aborted`, those whose client hung up). */
const countedCalls = async (tag: string, what: '_calls' | '_aborted' = '_calls') =>
  Object.entries((await (await fetch(`${stack.sandboxUrl}/${what}`)).json()) as Record<string, number>)
    .filter(([k]) => k.includes(`chunktest=${tag}`))
    .reduce((a, [, n]) => a + n, 0);

describe('batch chunk activity', () => {
  let store: Store;
  let upstreams: ReturnType<typeof createUpstreams>;
  let activities: ReturnType<typeof testActivities>;
  let t: Tenant;
  const tag = uniqueName('c');

  before(async () => {
    const catalogPath = writeTestCatalog('chunk', (base) => {
      base.providers.push(
        providerEntry('chunk-counted', `\${SANDBOX_URL}/~chunktest=${tag}/openai/v1`, { max_concurrency: 10 }),
        // Two calls at a time, each answered after 10 s: a chunk's lines wait in calls and for a slot.
        providerEntry('chunk-slow', `\${SANDBOX_URL}/~chunktest=slow-${tag},latency=10000/openai/v1`, {
          max_concurrency: 2,
          timeout_ms: 30_000,
        }),
      );
      const endpoint = (provider: string) => endpointEntry(provider, 1, { upstream_model: 'sandbox-chat' });
      base.models.push(
        modelEntry('test/chunk-counted', [endpoint('chunk-counted')], { context_length: 1000 }),
        modelEntry('test/chunk-slow', [endpoint('chunk-slow')], { context_length: 1000 }),
      );
    });
    const config = loadConfig({
      MONGODB_URI: stack.mongoUri,
      MONGODB_DATABASE: uniqueName('db').replace(/-/g, '_'),
      SANDBOX_URL: stack.sandboxUrl,
      CATALOG_PATH: catalogPath,
    });
    store = await Store.connect(stack.mongoUri, config.mongo.database);
    upstreams = createUpstreams(config, store);
    activities = testActivities(store, upstreams, config);
    t = await createTenant(store, 10);
  });
  after(async () => {
    await upstreams.close();
    await store.close();
  });

  /** A batch in the shared collections, as the API stores one. */
  const ref = (id: string) => ({ _id: id });
  /** Its stored results (a scan of the shared collection: fine in a test). */
  const storedResults = async (id: string): Promise<ResultDoc[]> =>
    (
      await store.db
        .collection<{ _id: string; text: string }>('batch_results')
        .find({ _id: { $regex: `^${id}:` } })
        .toArray()
    ).map((d) => JSON.parse(d.text));
  const progressOf = (id: string, chunk = 0) => readProgress(store, ref(id), chunk);

  async function storeBatch(
    bodies: Record<string, unknown>[],
    chunkLines = 100,
    tenant = t,
    model = 'test/chunk-counted',
  ): Promise<string> {
    const id = newBatchId();
    const lines = bodies.map((body, i) => ({ line: i, custom_id: `c${i}`, body: JSON.stringify(body) }));
    const starts = await storeInputs(store, ref(id), packLines(lines), chunkLines);
    const doc = testBatchDoc(tenant, {
      _id: id,
      model,
      total: lines.length,
      chunks: starts.length,
      chunk_starts: starts,
    });
    await batches(store).insertOne(doc);
    return id;
  }
  const chat = (i: number, extra = {}) => ({ messages: [{ role: 'user', content: `q${i}` }], max_tokens: 3, ...extra });

  it('a retry resumes from the stored progress, not from an older heartbeat, and its counts never shrink', async () => {
    const id = await storeBatch(Array.from({ length: 10 }, (_, i) => chat(i)));
    // A first attempt runs the chunk.
    const first = new MockActivityEnvironment();
    const before = await countedCalls(tag);
    await first.run(activities.processBatchChunk, id, 0);
    expect((await countedCalls(tag)) - before).to.equal(10);
    const stored = await progressOf(id);
    expect(stored).to.include({ completed: 10, failed: 0, n: 10 });

    // Rewind to an attempt that died having stored six lines, while the last heartbeat Temporal
    // kept says two (as after a server restart).
    await store.db.collection('batch_results').deleteMany({ _id: { $in: [6, 7, 8, 9].map((n) => `${id}:${seqId(n)}`) } as never });
    const six = {
      ...emptyTally(),
      completed: 6,
      input_tokens: stored!.input_tokens,
      output_tokens: stored!.output_tokens,
      cost: stored!.cost,
    };
    await store.db
      .collection('batch_progress')
      .replaceOne({ _id: `${id}:${seqId(0)}` as never }, { ...six, done: [0, 1, 2, 3, 4, 5], n: 6 });

    const retry = new MockActivityEnvironment({ heartbeatDetails: { done: [0, 1], completed: 2, failed: 0 } });
    const mid = await countedCalls(tag);
    const out = await retry.run(activities.processBatchChunk, id, 0);
    expect((await countedCalls(tag)) - mid, 'only the four unstored lines are called again').to.equal(4);
    expect(out).to.deep.equal({ completed: 10, failed: 0 });
    expect(await storedResults(id)).to.have.length(10);
  });

  it('a batch of one chunk is run and closed by one activity; stopped before its lines are done, it stays open', async () => {
    const id = await storeBatch([chat(0), chat(1), chat(2)]);
    const watched = await Store.connect(stack.mongoUri, store.db.databaseName, { monitorCommands: true });
    const statusWrites: unknown[] = [];
    const batchReads: unknown[] = [];
    const progressReads: unknown[] = [];
    watched.client.on('commandStarted', (e) => {
      if (e.commandName === 'update' && e.command.update === 'batches') statusWrites.push(e.command.updates);
      if (e.commandName === 'find' && e.command.find === 'batches') batchReads.push(e.command.filter);
      if (e.commandName === 'find' && e.command.find === 'batch_progress') progressReads.push(e.command.filter);
    });
    try {
      const run = testActivities(watched, upstreams, loadConfig({})).processOnlyChunk;
      expect(await new MockActivityEnvironment().run(run, id)).to.deep.equal({ completed: 3, failed: 0 });
    } finally {
      await watched.close();
    }
    // From in_progress to completed in one write (no finalizing in between), from one read of the batch.
    expect(statusWrites).to.have.length(1);
    expect(batchReads).to.have.length(1);
    const closed = await readBatch(store, id);
    expect(closed).to.include({ status: 'completed' });
    expect(closed!.finalized_at).to.be.instanceOf(Date);
    expect(closed!.final_counts).to.deep.equal({ completed: 3, failed: 0 });
    const results = await storedResults(id);
    expect(results.map((r) => r.custom_id).sort()).to.deep.equal(['c0', 'c1', 'c2']);
    // Its totals are the tally the chunk kept, not read back: the progress is read once, to resume from.
    expect(progressReads).to.have.length(1);
    const sum = (f: (r: ResultDoc) => number) => results.reduce((n, r) => n + f(r), 0);
    expect(closed!.usage).to.deep.equal({
      prompt_tokens: sum((r) => r.usage!.input_tokens),
      completion_tokens: sum((r) => r.usage!.output_tokens),
      total_tokens: sum((r) => r.usage!.input_tokens + r.usage!.output_tokens),
      cost: roundUsd(sum((r) => r.usage!.cost)),
    });
    expect(closed!.usage!.cost).to.be.above(0);
    expect(closed!.provider).to.equal('chunk-counted');
    // Asked to stop as it starts: Temporal hears the chunk was cancelled, and the close is left to the workflow.
    const other = await storeBatch([chat(3), chat(4)]);
    const env = new MockActivityEnvironment();
    env.cancel();
    const err = await env.run(activities.processOnlyChunk, other).then(
      () => null,
      (e: Error) => e,
    );
    expect(err).to.be.instanceOf(CancelledFailure);
    expect(await readBatch(store, other)).to.include({ status: 'in_progress', finalized_at: null });
  });

  it('a chunk asked to stop while its lines wait on the provider stops them at once: those in a call hang up, those waiting for a slot send nothing', async () => {
    const id = await storeBatch(
      Array.from({ length: 6 }, (_, i) => chat(i)),
      100,
      t,
      'test/chunk-slow',
    );
    const env = new MockActivityEnvironment();
    const started = Date.now();
    const run = env.run(activities.processBatchChunk, id, 0).then(
      () => null,
      (e: Error) => e,
    );
    await until('two lines in calls', async () => (await countedCalls(`slow-${tag}`)) === 2);
    env.cancel();
    expect(await run).to.be.instanceOf(CancelledFailure);
    expect(Date.now() - started).to.be.below(5_000);
    await until('both calls hung up', async () => (await countedCalls(`slow-${tag}`, '_aborted')) === 2);
    expect(await countedCalls(`slow-${tag}`)).to.equal(2);
    expect(await storedResults(id)).to.deep.equal([]);
  });

  it('validation uses the check made at creation, and checks the chunks of a batch stored without one', async () => {
    const id = await storeBatch([chat(0), { messages: [] }, chat(2)]);
    const watched = await Store.connect(stack.mongoUri, store.db.databaseName, { monitorCommands: true });
    try {
      const chunkReads: unknown[] = [];
      watched.client.on('commandStarted', (e) => {
        if (e.commandName === 'find' && e.command.find === 'batch_inputs') chunkReads.push(e.command.filter);
      });
      const validate = testActivities(watched, upstreams, loadConfig({})).validateBatchLines;
      // Stored as an earlier version stored it: no check recorded, so every chunk is read.
      const fromChunks = (await new MockActivityEnvironment().run(validate, id, false)) as { invalid: number; examples: string[] };
      expect(fromChunks.invalid).to.equal(1);
      expect(fromChunks.examples[0]).to.match(/^c1 \(messages/);
      expect(chunkReads).to.have.length(1);
      // As the API stores a batch now: the check made at creation is used, nothing is read back.
      chunkReads.length = 0;
      await batches(store).updateOne({ _id: id }, { $set: { validation: { invalid: 2, examples: ['recorded'] } } });
      expect(await new MockActivityEnvironment().run(validate, id, false)).to.deep.equal({ invalid: 2, examples: ['recorded'] });
      expect(chunkReads).to.have.length(0);
    } finally {
      await watched.close();
    }
  });

  it("stores each line's result as one JSON text beside its _id (FerretDB's cost grows with fields, not documents)", async () => {
    const id = await storeBatch([chat(0), chat(1)]);
    await new MockActivityEnvironment().run(activities.processBatchChunk, id, 0);
    const raw = await store.db
      .collection('batch_results')
      .find({ _id: { $regex: `^${id}:` } } as never)
      .toArray();
    expect(raw).to.have.length(2);
    for (const d of raw) expect(Object.keys(d)).to.deep.equal(['_id', 'text']);
    const [r] = (await storedResults(id)).filter((x) => x.line === 0);
    expect(r).to.include({ custom_id: 'c0', ok: true, provider: 'chunk-counted' });
    expect(r.response!.status_code).to.equal(200);
  });

  it("stores a batch document's objects and arrays as JSON text (FerretDB's cost is per element), and reads either form the same", async () => {
    const doc = testBatchDoc(t, { model: 'sandbox/chat-1', total: 0, provider_only: ['sandbox-alpha'] });
    const lines = Array.from({ length: 250 }, (_, i) => ({ custom_id: `c${i}`, body: JSON.stringify(chat(i)) }));
    const created = await createBatch(store, { ...doc, total: 250, validation: { invalid: 0, examples: [] } }, packLines(lines), 100);
    await writeStatus(store, created, {
      status: 'completed',
      finalized_at: new Date(),
      final_counts: { completed: 250, failed: 0 },
      usage: null,
    });
    const raw = (await store.db.collection('batches').findOne({ _id: created._id } as never))!;
    for (const k of ['chunk_starts', 'meta', 'validation', 'provider_only', 'final_counts']) expect(typeof raw[k], k).to.equal('string');
    expect(raw.chunk_starts).to.equal('[0,100,200]');
    expect(raw.usage).to.equal(null);
    const read = (await readBatch(store, created._id))!;
    expect(read).to.deep.include({
      chunk_starts: [0, 100, 200],
      meta: doc.meta,
      validation: { invalid: 0, examples: [] },
      provider_only: ['sandbox-alpha'],
      final_counts: { completed: 250, failed: 0 },
      status: 'completed',
    });
    // A document of an earlier version, its fields as they were, reads the same.
    const { _id, ...fields } = read;
    await store.db.collection('batches').replaceOne({ _id } as never, fields);
    expect(await readBatch(store, created._id)).to.deep.equal(read);
  });

  it('a chunk stores an empty progress document as it starts, before any line is sent; the last chunk, which no chunk follows, does not', async () => {
    // Two chunks: [0, 1] and [2].
    const id = await storeBatch([chat(0), chat(1), chat(2)], 2);
    const watched = await Store.connect(stack.mongoUri, store.db.databaseName, { monitorCommands: true });
    try {
      const writes: { name: string; coll: string; body: Record<string, unknown> }[] = [];
      watched.client.on('commandStarted', (e) => {
        if (['insert', 'update'].includes(e.commandName))
          writes.push({ name: e.commandName, coll: e.command[e.commandName], body: e.command as Record<string, unknown> });
      });
      const progressWrites = (chunk: number) => {
        const inChunk = writes.slice(0);
        writes.length = 0;
        const first = inChunk.findIndex((w) => w.coll === 'batch_progress');
        expect(first, `chunk ${chunk}'s progress`).to.be.greaterThan(-1);
        const counted = (inChunk[first].body.updates as { u: Record<string, unknown> }[])[0].u;
        return { before: inChunk.slice(0, first).map((w) => w.coll), counted };
      };
      const run = (chunk: number) =>
        new MockActivityEnvironment().run(testActivities(watched, upstreams, loadConfig({})).processBatchChunk, id, chunk);
      await run(0);
      const first = progressWrites(0);
      // Before any result: the marker, with nothing counted.
      expect(first.before).to.not.include('batch_results');
      expect(first.counted).to.include({ completed: 0, failed: 0, n: 0 });
      expect(await progressOf(id)).to.include({ completed: 2, n: 2 });
      await run(1);
      const last = progressWrites(1);
      // The last chunk's first progress write counts its stored line.
      expect(last.before).to.include('batch_results');
      expect(last.counted).to.include({ completed: 1, n: 1 });
      expect(await progressOf(id, 1)).to.include({ completed: 1, n: 1 });
    } finally {
      await watched.close();
    }
  });

  it("running batches' live counts read a few progress documents per poll, of every batch at once, not every chunk's one by one", async () => {
    // 5 chunks of 100 lines (the last of 30): 0 and 1 finished, 2 half-way, 3 and 4 not started.
    const id = await storeBatch(Array.from({ length: 430 }, (_, i) => chat(i)));
    for (const c of [0, 1]) await new MockActivityEnvironment().run(activities.processBatchChunk, id, c);
    await saveProgress(store, ref(id), 2, { ...emptyTally(), completed: 40, failed: 2 }, []);
    const b = (await readBatch(store, id))!;
    const watched = await Store.connect(stack.mongoUri, store.db.databaseName, { monitorCommands: true });
    try {
      // Each read of progress documents, as the chunks it asks for (`<batch>:<chunk>`).
      const reads: string[][] = [];
      watched.client.on('commandStarted', (e) => {
        if (e.commandName !== 'find' || e.command.find !== 'batch_progress') return;
        const asked = e.command.filter._id.$in as string[];
        reads.push(asked.map((k) => `${k.slice(0, k.indexOf(':')) === id ? 'b' : 'o'}${Number(k.slice(k.lastIndexOf(':') + 1))}`));
      });
      const live = new LiveCounts(watched);
      const poll = async () => {
        reads.length = 0;
        const c = await live.of(b);
        return { ...c, reads: [...reads] };
      };
      // One read per poll: the first asks for every chunk (up to 8), the next ones skip the finished chunks.
      expect(await poll()).to.deep.equal({ completed: 240, failed: 2, reads: [['b0', 'b1', 'b2', 'b3', 'b4']] });
      expect(await poll()).to.deep.equal({ completed: 240, failed: 2, reads: [['b2', 'b3', 'b4']] });
      // Chunk 3 starts, chunk 2 finishes: both are read once more, then chunk 2 is remembered.
      await saveProgress(store, ref(id), 3, { ...emptyTally(), completed: 1 }, []);
      await saveProgress(store, ref(id), 2, { ...emptyTally(), completed: 98, failed: 2 }, []);
      expect(await poll()).to.deep.equal({ completed: 299, failed: 2, reads: [['b2', 'b3', 'b4']] });
      expect(await poll()).to.deep.equal({ completed: 299, failed: 2, reads: [['b3', 'b4']] });

      // Several batches (as a list shows them) are read together: one read per round for all of them.
      const other = await storeBatch(Array.from({ length: 250 }, (_, i) => chat(i)));
      await new MockActivityEnvironment().run(activities.processBatchChunk, other, 0);
      await saveProgress(store, ref(other), 1, { ...emptyTally(), completed: 7 }, []);
      const o = (await readBatch(store, other))!;
      reads.length = 0;
      const closed = { ...b, _id: 'batch_closed', final_counts: { completed: 1, failed: 0 } };
      expect(await live.ofEach([o, closed, b])).to.deep.equal([
        { completed: 107, failed: 0 },
        { completed: 1, failed: 0 },
        { completed: 299, failed: 2 },
      ]);
      expect(reads).to.deep.equal([['o0', 'o1', 'o2', 'b3', 'b4']]);

      // A batch further along than one read looks ahead is read on until its first chunk not started.
      const long = await storeBatch(Array.from({ length: 1_100 }, (_, i) => chat(i)));
      for (let c = 0; c < 10; c++) await saveProgress(store, ref(long), c, { ...emptyTally(), completed: 1 }, []);
      const l = (await readBatch(store, long))!;
      reads.length = 0;
      expect(await live.of(l)).to.deep.equal({ completed: 10, failed: 0 });
      expect(reads.map((r) => r.length)).to.deep.equal([8, 3]);

      // A closed batch's counts are its own: nothing is read.
      reads.length = 0;
      expect(await live.of({ ...b, final_counts: { completed: 428, failed: 2 } })).to.deep.equal({ completed: 428, failed: 2 });
      expect(reads).to.have.length(0);
    } finally {
      await watched.close();
    }
  });

  it('a finished chunk stores its results as pages: any page of results is one or two reads by _id, never a scan', async () => {
    // 330 lines in chunks of 100 (the last of 30): pages of 100 lines within each chunk.
    const id = await storeBatch(Array.from({ length: 330 }, (_, i) => chat(i)));
    const b = (await readBatch(store, id))!;
    expect(b.chunk_starts).to.deep.equal([0, 100, 200, 300]);
    // Chunk 3 has not run: reading it finds nothing, without a scan.
    for (const c of [0, 1, 2]) await new MockActivityEnvironment().run(activities.processBatchChunk, id, c);
    expect(await pages(store).countDocuments({ _id: { $regex: `^${id}:` } })).to.equal(3);
    // A page is stored deflated (FerretDB's cost is per byte read); one in an earlier version's form
    // (its lines as an array of strings) is read the same, by the reads below.
    const stored = (await pages(store).findOne({ _id: { $regex: `^${id}:` } }))!;
    expect(stored.lines).to.equal(undefined);
    const unpacked = await unpackPage(stored);
    expect(unpacked.lines).to.have.length(100);
    expect(unpacked.lines.map((l) => JSON.parse(l).custom_id)).to.deep.equal(Array.from({ length: 100 }, (_, i) => `c${stored.first + i}`));
    expect(stored.z!.buffer.length).to.be.below(Buffer.byteLength(unpacked.lines.join('\n')) / 2);
    await pages(store).replaceOne({ _id: stored._id }, { first: stored.first, lines: unpacked.lines });

    const watched = await Store.connect(stack.mongoUri, store.db.databaseName, { monitorCommands: true });
    const idsOf = (f: Record<string, unknown>) => (typeof f._id === 'string' ? [f._id] : (f._id as { $in: string[] }).$in);
    try {
      const finds: Record<string, unknown>[] = [];
      watched.client.on('commandStarted', (e) => {
        if (e.commandName === 'find') finds.push(e.command.filter as Record<string, unknown>);
      });
      const read = async (opts: { after?: number; limit?: number }) => {
        finds.length = 0;
        const out: number[] = [];
        for await (const r of resultTexts(watched, b, opts)) {
          expect(JSON.parse(r.text).custom_id).to.equal(`c${r.line}`);
          out.push(r.line);
        }
        // Every read is of `_id`s (one, or a set): FerretDB answers it from the index, whatever is stored.
        for (const f of finds) expect(Object.keys(f), JSON.stringify(f)).to.deep.equal(['_id']);
        for (const f of finds)
          expect(
            idsOf(f).every((i) => typeof i === 'string'),
            JSON.stringify(f),
          ).to.equal(true);
        return out;
      };
      const range = (from: number, n: number) => Array.from({ length: n }, (_, i) => from + i);
      expect(await read({ after: -1, limit: 100 })).to.deep.equal(range(0, 100));
      expect(finds).to.have.length(1);
      // A page across a page boundary: both pages in one read, and no more than the limit needs.
      expect(await read({ after: 149, limit: 100 })).to.deep.equal(range(150, 100));
      expect(finds.map(idsOf)).to.have.deep.members([[`${id}:${seqId(1)}.${seqId(0)}`, `${id}:${seqId(2)}.${seqId(0)}`]]);
      // Into the unfinished chunk: its missing page and its progress are read, and nothing of it is done.
      expect(await read({ after: 279, limit: 100 })).to.deep.equal(range(280, 20));
      expect(finds).to.have.length(3);

      // Pages read once through a cache are read from it the next time: no page is asked of the store.
      const cache = new PageCache();
      const pageFinds = async (opts: { after?: number; limit?: number }) => {
        finds.length = 0;
        const out: number[] = [];
        for await (const r of resultTexts(watched, b, opts, cache)) out.push(r.line);
        return { out, pages: finds.filter((f) => idsOf(f).some((i) => i.includes('.'))).length };
      };
      // A download reads its pages several at a time: the three in one read (with chunk 3's, not found).
      expect(await pageFinds({ after: -1, limit: 300 })).to.deep.equal({ out: range(0, 300), pages: 1 });
      expect(await pageFinds({ after: -1, limit: 300 })).to.deep.equal({ out: range(0, 300), pages: 0 });

      // An unfinished chunk's done lines are read one by one (the page comes when it finishes).
      await saveProgress(store, ref(id), 3, { ...emptyTally(), completed: 2 }, [300, 302]);
      const partial = (['300', '302'] as const).map((n) => ({
        _id: seqId(Number(n)),
        line: Number(n),
        custom_id: `c${n}`,
        id: `gen-${n}`,
        ok: false,
        provider: null,
        response: null,
        error: { type: 'x', message: 'x' },
        usage: null,
      }));
      // Line 300 as this version stores a result (its JSON text), 302 as earlier versions did (its fields).
      const [text, fields] = partial;
      const { _id: textId, ...textFields } = text;
      await store.db.collection('batch_results').insertMany([
        { _id: `${id}:${textId}`, text: JSON.stringify(textFields) },
        { ...fields, _id: `${id}:${fields._id}` },
      ] as never[]);
      expect(await read({ after: 295, limit: 10 })).to.deep.equal([296, 297, 298, 299, 300, 302]);
      expect(await read({})).to.have.length(302);
    } finally {
      await watched.close();
    }
  });

  it('a stored tally is never replaced by a smaller one', async () => {
    const id = newBatchId();
    await saveProgress(store, ref(id), 0, { ...emptyTally(), completed: 5 }, [0, 1, 2, 3, 4]);
    await saveProgress(store, ref(id), 0, { ...emptyTally(), completed: 2 }, [0, 1]); // an older attempt, still running
    expect(await progressOf(id)).to.include({ completed: 5, n: 5 });
    await saveProgress(store, ref(id), 0, { ...emptyTally(), completed: 6 }, [0, 1, 2, 3, 4, 5]);
    expect(await progressOf(id)).to.include({ completed: 6, n: 6 });
  });

  it('a progress document keeps its done lines as runs, however many lines are done', async () => {
    const id = newBatchId();
    const done = [...Array.from({ length: 400 }, (_, i) => 499 - i), 7, 3, 4, 5];
    await saveProgress(store, ref(id), 0, { ...emptyTally(), completed: done.length }, done);
    const raw = await store.db.collection('batch_progress').findOne({ _id: `${id}:${seqId(0)}` } as never);
    // As the JSON text of the runs: one field, where an array costs FerretDB per element.
    expect(raw!.done_runs).to.equal('[3,5,7,7,100,499]');
    expect(raw!.done).to.equal(undefined);
    expect((await progressOf(id))!.done).to.deep.equal([...done].sort((x, y) => x - y));
    // A document of the previous version, runs as an array, reads the same.
    await store.db
      .collection('batch_progress')
      .updateOne({ _id: `${id}:${seqId(0)}` } as never, { $set: { done_runs: [3, 5, 7, 7, 100, 499] } });
    expect((await progressOf(id))!.done).to.deep.equal([...done].sort((x, y) => x - y));
  });

  it("a line naming a missing preset (or another workspace's) fails alone with a clear error", async () => {
    const other = await createTenant(store, 1);
    await addPresetVersion(store, {
      workspaceId: other.workspaceId,
      slug: 'theirs',
      creator: 'u',
      config: { model: 'test/chunk-counted' },
      systemPrompt: 'secret',
    });
    const id = await storeBatch([chat(0), chat(1, { preset: 'no-such-preset' }), { ...chat(2), model: '@preset/theirs' }, chat(3)]);
    const env = new MockActivityEnvironment();
    const out = await env.run(activities.processBatchChunk, id, 0);
    expect(out).to.deep.equal({ completed: 2, failed: 2 });
    const byLine = new Map((await storedResults(id)).map((r) => [r.line, r]));
    expect(byLine.get(1)!.error).to.deep.include({ type: 'not_found', code: 404, message: 'Preset "no-such-preset" not found' });
    expect(byLine.get(2)!.error).to.deep.include({ type: 'not_found', code: 404, message: 'Preset "theirs" not found' });
    expect(byLine.get(0)!.ok).to.equal(true);
    expect(byLine.get(3)!.ok).to.equal(true);
  });

  it('the chunk writer keeps results through a failed write and stores them, billed once, when the database answers again', async () => {
    const id = await storeBatch([chat(0)]);
    const batch = (await readBatch(store, id))!;
    const broken = await Store.connect(stack.mongoUri, store.db.databaseName);
    await broken.close();
    const opts = { store: broken, usage: new UsageLedger(broken), batch, chunkIndex: 0, outageMs: 60_000 };
    const writer = new ChunkWriter(opts, null);
    const result: ResultDoc = {
      _id: seqId(0),
      line: 0,
      custom_id: 'c0',
      id: `gen-batch-${id.slice(6)}-0`,
      ok: true,
      provider: 'chunk-counted',
      response: { status_code: 200, request_id: 'x', body: {} },
      error: null,
      usage: { input_tokens: 1, output_tokens: 1, cost: 0.5 },
    };
    writer.add(result);
    await writer.flush();
    expect(writer.failing).to.equal(true);
    expect(writer.backlog).to.equal(1);
    expect(writer.gaveUp).to.equal(false);
    // The database is back.
    Object.assign(opts, { store, usage: new UsageLedger(store), credits: new SpendAdmission(store) });
    await writer.flush();
    expect(writer.backlog).to.equal(0);
    expect(writer.failing).to.equal(false);
    expect([...writer.done]).to.deep.equal([0]);
    expect(await storedResults(id)).to.have.length(1);
    expect(await store.usage.countDocuments({ batch_id: id })).to.equal(1);
    expect(await progressOf(id)).to.include({ completed: 1, n: 1 });
  });

  it('a group written again after its progress write failed counts each line once', async () => {
    const id = await storeBatch([chat(0), chat(1)]);
    const batch = (await readBatch(store, id))!;
    // The real database, with one failure injected where a dying database would fail: the progress
    // write, after the results and usage records of the group were stored.
    let failures = 0;
    const faulty = Object.create(store) as Store;
    Object.defineProperty(faulty, 'db', {
      value: new Proxy(store.db, {
        get(db, prop) {
          if (prop !== 'collection') return Reflect.get(db, prop);
          return (name: string) => {
            const c = db.collection(name);
            if (!name.endsWith('_progress')) return c;
            return new Proxy(c, {
              get(coll, p) {
                if (p === 'replaceOne' && failures === 0)
                  return async () => {
                    failures++;
                    throw new Error('connection reset (injected)');
                  };
                const v = Reflect.get(coll, p);
                return typeof v === 'function' ? v.bind(coll) : v;
              },
            });
          };
        },
      }),
    });
    const writer = new ChunkWriter({ store: faulty, usage: new UsageLedger(store), batch, chunkIndex: 0, outageMs: 60_000 }, null);
    for (const line of [0, 1]) {
      writer.add({
        _id: seqId(line),
        line,
        custom_id: `c${line}`,
        id: `gen-batch-${id.slice(6)}-${line}`,
        ok: true,
        provider: 'chunk-counted',
        response: { status_code: 200, request_id: 'x', body: {} },
        error: null,
        usage: { input_tokens: 1, output_tokens: 1, cost: 0.5 },
      });
    }
    await writer.flush();
    expect(failures).to.equal(1);
    expect(writer.failing).to.equal(true);
    expect(writer.backlog).to.equal(2);
    await writer.flush();
    expect(writer.backlog).to.equal(0);
    expect(writer.tally).to.include({ completed: 2, failed: 0, cost: 1 });
    expect(await progressOf(id)).to.include({ completed: 2, n: 2 });
    expect(await store.usage.countDocuments({ batch_id: id })).to.equal(2);
  });

  it("a chunk's lines follow the workspace's routing settings, read as a synchronous call reads them", async () => {
    const other = await createTenant(store, 10);
    await store.workspaces.updateOne({ _id: other.workspaceId }, { $set: { settings: { ignore: ['chunk-counted'] } } });
    const id = await storeBatch([chat(0), chat(1)], 100, other);
    const counts = await new MockActivityEnvironment().run(testActivities(store, upstreams, loadConfig({})).processOnlyChunk, id);
    expect(counts).to.deep.equal({ completed: 0, failed: 2 });
    for (const r of await storedResults(id)) expect(r.error).to.include({ code: 404, type: 'not_found' });
  });

  it('the line runner turns a line no endpoint may serve into a failed result (404), not a thrown error', async () => {
    const id = await storeBatch([chat(0)]);
    const batch = (await readBatch(store, id))!;
    const runner = new LineRunner({
      store,
      upstreams,
      batch: { ...batch, provider_only: ['chunk-counted'] },
      workspace: { ignore: ['chunk-counted'] },
      credits: new SpendAdmission(store),
      lineAttempts: 1,
      outageMs: 1,
    });
    const outcome = await runner
      .run({ line: 0, custom_id: 'c0', body: JSON.stringify(chat(0)) }, new AbortController().signal)
      .catch((err) => err);
    expect(outcome).to.not.be.instanceOf(Error);
    const r = outcome.result;
    expect(r.ok).to.equal(false);
    expect(r.error).to.include({ code: 404, type: 'not_found' });
  });
});
