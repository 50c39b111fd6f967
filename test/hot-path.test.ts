// The synchronous hot path under concurrency: rate-limit blocks claimed without races or
// duplicate-key storms, exact admission across processes, and usage records group-committed yet
// durable before the client is answered.
import { expect } from 'chai';
import { MongoServerError } from 'mongodb';
import fs from 'node:fs';
import path from 'node:path';
import { RateLimiter, blockSizeFor } from '../domain/accounts/rate-limit';
import { JOURNAL_GROUP_MS, UsageLedger, usageDetails } from '../domain/accounts/usage-ledger';
import { UsageJournal } from '../domain/accounts/usage-journal';
import { getBalance } from '../domain/accounts/credits';
import { Store, type UsageDoc } from '../infrastructure/store';
import { toStoredUsage } from '../infrastructure/store/usage-form';
import { ServiceUnavailableError } from '../infrastructure/errors';
import { freePort } from '../devstack/processes';
import { startFerretDB } from '../devstack/services';
import { stack } from './fixture';
import {
  clearOfWindowEdge,
  allApiProcessesUp,
  call,
  createTenant,
  startGatewayProcess,
  startTestGateway,
  storeWith,
  uniqueName,
  usageRecord,
  writeTestCatalog,
  type TestGateway,
  storedUsage,
  storedRecord,
} from './helpers';
import { endpointEntry, modelEntry, providerEntry } from '../domain/catalog/entries';

/** A store connection that counts the insert commands sent to one collection. */
async function countingStore(database: string, collection: string): Promise<{ store: Store; inserts: () => number }> {
  const store = await Store.connect(stack.mongoUri, database, { monitorCommands: true });
  let n = 0;
  store.client.on('commandStarted', (e) => {
    if (e.commandName === 'insert' && String(e.command.insert).startsWith(collection)) n++;
  });
  return { store, inserts: () => n };
}

/**
 * Admission is exact: every ticket used, none twice, everything past the limit refused. Unless some
 * requests were admitted unchecked (a claim the database did not answer in time fails open): then a
 * process may stop holding up to a claim and a half of tickets it no longer needs, so fewer than the
 * limit went out, never more; and a stall is brief, so requests past the limit are still refused
 * (a limiter that let them all through unchecked would not be one).
 */
function expectExactUnlessUnchecked(counts: { ticketed: number; unchecked: number; refused: number }, total: number, limit: number): void {
  const { ticketed, unchecked, refused } = counts;
  expect(ticketed + unchecked + refused).to.equal(total);
  if (!unchecked) {
    expect(ticketed).to.equal(limit);
    expect(refused).to.equal(total - limit);
    return;
  }
  expect(ticketed, `${unchecked} admitted unchecked`)
    .to.be.at.most(limit)
    .and.at.least(limit - 2 * Math.ceil(1.5 * blockSizeFor(limit)));
  expect(refused, `${unchecked} admitted unchecked`).to.be.above(0);
}

/** Requests a gateway admitted without a ticket, from its /metrics. */
async function uncheckedAdmissions(url: string): Promise<number> {
  const scrape = await (await fetch(`${url}/metrics`)).text();
  const found = /^gateway_rate_limit_unchecked_total (\d+)/m.exec(scrape);
  expect(found, 'gateway_rate_limit_unchecked_total in /metrics').to.not.equal(null);
  return Number(found?.[1]);
}

const decision = { model: 'jev-1.13', state: 'hot path', questions: { q: { type: 'noul', instructions: 'ok?' } } };

describe('rate limiter without contention', () => {
  const database = uniqueName('rl').replace(/-/g, '_');
  let a: Awaited<ReturnType<typeof countingStore>>;
  let b: Awaited<ReturnType<typeof countingStore>>;
  before(async () => {
    a = await countingStore(database, 'rate_tickets');
    b = await countingStore(database, 'rate_tickets');
  });
  after(async () => {
    await a.store.close();
    await b.store.close();
  });

  it('50 concurrent requests in one process never race for a ticket: one insert per block, none wasted', async () => {
    await clearOfWindowEdge();
    const limiter = new RateLimiter(a.store, 3, 3600);
    const before = a.inserts();
    const key = `key_${Date.now()}`;
    const decisions = await Promise.all(Array.from({ length: 50 }, () => limiter.take(key)));
    expect(decisions.filter((d) => d.allowed)).to.have.length(3);
    expect(
      decisions
        .filter((d) => d.allowed)
        .map((d) => d.remaining)
        .sort(),
    ).to.deep.equal([0, 1, 2]);
    // Before blocks, every one of the 50 inserted the same ticket: 49 duplicate-key errors and a scan.
    expect(a.inserts() - before).to.equal(3);
  });
  it("fails open while the database's disk is full: admitted unchecked with one failed claim a second, exact again once claims go through", async () => {
    await clearOfWindowEdge();
    let full = true;
    let claims = 0;
    // As the embedded FerretDB refuses an insert with its disk full (probed).
    const store = storeWith(a.store, 'rateTickets', (real) => ({
      insertMany: async (...args: Parameters<typeof real.insertMany>) => {
        claims++;
        if (full) throw new MongoServerError({ message: '[msg_insert.go:168] [db.go:167] database or disk is full (13)', code: 1 });
        return real.insertMany(...args);
      },
    }));
    let now = Date.now();
    const limiter = new RateLimiter(store, 2, 3600, () => now);
    const key = `key_full_${Date.now()}`;
    const during = await Promise.all(Array.from({ length: 5 }, () => limiter.take(key)));
    expect(during.every((d) => d.allowed && d.unchecked)).to.equal(true);
    expect(claims).to.equal(1); // the five waited on one claim
    expect(await limiter.take(key)).to.include({ allowed: true, unchecked: true });
    expect(claims).to.equal(1); // within the second, no claim is tried
    now += 1_001;
    full = false;
    const after = [await limiter.take(key), await limiter.take(key), await limiter.take(key)];
    expect(after.map((d) => [d.allowed, d.unchecked ?? false])).to.deep.equal([
      [true, false],
      [true, false],
      [false, false],
    ]);
  });

  it('takes weighted requests: tickets across blocks and claims, none twice, refused once fewer are left than asked', async () => {
    await clearOfWindowEdge();
    const limit = 9_600; // blocks of 64, claimed up to 2 at a time
    const key = `key_weighted_${Date.now()}`;
    const p1 = new RateLimiter(a.store, limit, 3600);
    const p2 = new RateLimiter(b.store, limit, 3600);
    // Two processes take 150 tickets at a time, five callers each, until refused.
    const taken = { p1: 0, p2: 0 };
    const lastTickets: number[] = [];
    const caller = async (limiter: RateLimiter, name: 'p1' | 'p2') => {
      for (;;) {
        const d = await limiter.take(key, 150);
        if (!d.allowed) return;
        // A claim the database did not answer within a second (a loaded machine) is admitted
        // without tickets, as through an outage: nothing to check of it.
        if (d.unchecked) {
          await new Promise((r) => setTimeout(r, 10));
          continue;
        }
        expect(d.remaining).to.be.within(0, limit - 150);
        lastTickets.push(limit - d.remaining);
        taken[name] += 150;
      }
    };
    await Promise.all([...Array.from({ length: 5 }, () => caller(p1, 'p1')), ...Array.from({ length: 5 }, () => caller(p2, 'p2'))]);
    // Never more than the limit; what is left unadmitted is less than a weight per caller that ran dry.
    expect(taken.p1 + taken.p2).to.be.at.most(limit);
    expect(taken.p1 + taken.p2).to.be.above(limit - 10 * 150);
    // Each take ended on a ticket of its own.
    expect(new Set(lastTickets).size).to.equal(lastTickets.length);
    expect((await p1.take(key, limit)).allowed).to.equal(false);
  });

  it('two processes at c=50 each admit exactly the limit, at no more than two inserts per block of tickets', async () => {
    // Each process alone wants more than the limit, so neither can be left holding unused tickets.
    const limit = 3_200;
    await clearOfWindowEdge();
    const key = `key_two_${Date.now()}`;
    const p1 = new RateLimiter(a.store, limit, 3600);
    const p2 = new RateLimiter(b.store, limit, 3600);
    const before = a.inserts() + b.inserts();
    let admitted = 0;
    let refused = 0;
    let unchecked = 0;
    const client = async (limiter: RateLimiter, n: number) => {
      for (let i = 0; i < n; i++) {
        const d = await limiter.take(key);
        if (d.unchecked) unchecked++;
        else if (d.allowed) admitted++;
        else refused++;
      }
    };
    // 50 concurrent callers per process, 4,000 requests per process.
    await Promise.all([...Array.from({ length: 50 }, () => client(p1, 80)), ...Array.from({ length: 50 }, () => client(p2, 80))]);
    // A claim the database did not answer within a second (a stall of a loaded machine) fails open,
    // as through an outage: those requests are admitted unchecked, and the tickets stay exact.
    expectExactUnlessUnchecked({ ticketed: admitted, unchecked, refused }, 8_000, limit);
    const inserts = a.inserts() + b.inserts() - before;
    const blocks = limit / blockSizeFor(limit);
    // One insert per block claimed, plus at most one lost race per claim.
    expect(inserts).to.equal(p1.claimWrites + p2.claimWrites);
    expect(inserts).to.be.at.most(2 * blocks);
    // So at most 2 / 50 = 0.04 inserts per admitted request (the old limiter: one per request at best).
    expect(inserts / admitted).to.be.at.most(2 / blockSizeFor(limit));
  });

  it('two API processes at c=50 each admit exactly the limit over HTTP; the rest get 429 with Retry-After and rate headers', async () => {
    const env = { RATE_LIMIT_REQUESTS: '200', RATE_LIMIT_WINDOW_SECONDS: '3600' };
    await clearOfWindowEdge();
    const first = await startTestGateway({ withWorker: false, env });
    const second = await startTestGateway({ withWorker: false, env: { ...env, MONGODB_DATABASE: first.config.mongo.database } });
    try {
      const t = await createTenant(first.store);
      const statuses: number[] = [];
      let limited: Awaited<ReturnType<typeof call>> | null = null;
      const worker = async (gw: TestGateway) => {
        for (let i = 0; i < 6; i++) {
          const r = await call(`${gw.url}/api/v1/key`, { key: t.inferenceKey });
          statuses.push(r.status);
          expect(r.headers.get('x-ratelimit-limit')).to.equal('200');
          if (r.status === 429) limited = r;
        }
      };
      await Promise.all([...Array.from({ length: 50 }, () => worker(first)), ...Array.from({ length: 50 }, () => worker(second))]);
      const unchecked = (await uncheckedAdmissions(first.url)) + (await uncheckedAdmissions(second.url));
      const ok = statuses.filter((s) => s === 200).length;
      expectExactUnlessUnchecked({ ticketed: ok - unchecked, unchecked, refused: statuses.filter((s) => s === 429).length }, 600, 200);
      const r = limited as unknown as Awaited<ReturnType<typeof call>>;
      expect(r.body.error.code).to.equal(429);
      expect(Number(r.headers.get('retry-after'))).to.be.within(1, 3600);
      expect(r.headers.get('x-ratelimit-remaining')).to.equal('0');
      expect(Number(r.headers.get('x-ratelimit-reset'))).to.be.greaterThan(Date.now() / 1000);
      // Blocks of 3 for a limit of 200: 67 block documents for the key, not one per request (its
      // workspace's limit, ten times the key's, keeps its own blocks).
      const blocks = new RateLimiter(first.store, 200, 3600).blocksOf(Math.floor(Date.now() / 3_600_000));
      expect(await blocks.countDocuments({ key_id: { $regex: '^key_' } })).to.equal(Math.ceil(200 / blockSizeFor(200)));
    } finally {
      await second.stop();
      await first.stop();
    }
  });

  it('one gateway of two API processes sharing its port (API_PROCESSES=2) at c=100 admits exactly the limit, both processes serving', async function () {
    // Up to a minute waiting for the window's edge to pass (a run that reached it at hh:59 timed out), then the gateway starts.
    this.timeout(150_000);
    const database = uniqueName('rl_cluster').replace(/-/g, '_');
    const store = await Store.connect(stack.mongoUri, database);
    const dataDir = path.join(stack.tmpDir, uniqueName('rl-cluster'));
    await clearOfWindowEdge(3600, 60_000); // two processes start first
    const gw = await startGatewayProcess(
      'rl-cluster',
      ['api'],
      {
        API_PROCESSES: '2',
        RATE_LIMIT_REQUESTS: '200',
        RATE_LIMIT_WINDOW_SECONDS: '3600',
        MONGODB_URI: stack.mongoUri,
        MONGODB_DATABASE: database,
        TEMPORAL_ADDRESS: stack.temporalAddress,
        DATA_DIR: dataDir,
      },
      '/healthz',
    );
    try {
      await allApiProcessesUp(gw.url, 2);
      const t = await createTenant(store);
      const statuses: number[] = [];
      await Promise.all(
        Array.from({ length: 100 }, async () => {
          for (let i = 0; i < 6; i++) statuses.push((await call(`${gw.url}/api/v1/key`, { key: t.inferenceKey })).status);
        }),
      );
      const ok = statuses.filter((s) => s === 200).length;
      const unchecked = await uncheckedAdmissions(gw.url); // both processes' counters, joined
      expectExactUnlessUnchecked({ ticketed: ok - unchecked, unchecked, refused: statuses.filter((s) => s === 429).length }, 600, 200);
      const scrape = await (await fetch(`${gw.url}/metrics`)).text();
      const served = [0, 1].map((i) => Number(scrape.match(new RegExp(`gateway_api_process_requests\\{process="${i}"\\} (\\d+)`))?.[1]));
      // Each process accepts for itself: the share varies with which wakes first, but both serve.
      expect(served[0], scrape.slice(0, 500)).to.be.above(0);
      expect(served[1]).to.be.above(0);
      expect(served[0] + served[1]).to.be.at.least(600); // and the readiness probes
      // Each process journals its own calls: two live journal instances in the one directory.
      const alive = fs.readdirSync(path.join(dataDir, 'usage-journal')).filter((f) => f.endsWith('.alive'));
      expect(alive).to.have.length(2);
    } finally {
      await gw.proc.stop();
      await store.close();
    }
  });

  it('a key that claims again within a second claims more blocks per write, up to 1/64 of the limit; a slow one a block at a time', async () => {
    let now = 1_000_000_000_000;
    const limit = 1_000_000; // blocks of 64, at most 8 per write
    // Each request waits for the claim it set off, so no request ever waits for tickets (which
    // grows claims too): only how soon the claims follow each other differs.
    const take = async (limiter: RateLimiter, key: string) => {
      expect((await limiter.take(key)).allowed).to.equal(true);
      await limiter.claimsDone(key);
    };
    const busy = new RateLimiter(a.store, limit, 3600, () => now);
    const key = `key_quick_${Date.now()}`;
    for (let i = 0; i < 5_000; i++) await take(busy, key);
    // A block at a time would be 79 writes; growing 1, 2, 4, 8, 8, … it is 13 or so.
    expect(busy.claimWrites).to.be.within(10, 16);
    // One request a second: each claim is the first for half a minute, so it stays one block.
    const slow = new RateLimiter(a.store, limit, 3600, () => now);
    const slowKey = `key_slow_${Date.now()}`;
    for (let i = 0; i < 200; i++) {
      await take(slow, slowKey);
      now += 1_001;
    }
    const blocks = await slow.blocksOf(Math.floor(now / 3_600_000)).countDocuments({ key_id: slowKey });
    expect(blocks).to.equal(slow.claimWrites); // one block per write
    expect(blocks).to.equal(4); // 200 tickets in blocks of 64, the fourth claimed ahead at the 160th
  });

  it('a process far behind the others jumps ahead to free blocks in a few writes, and still uses every block it jumped over before refusing', async () => {
    let now = 1_000_000_000_000;
    const take = async (limiter: RateLimiter, key: string) => {
      const d = await limiter.take(key);
      await limiter.claimsDone(key);
      return d.allowed;
    };
    // A busy key: one process has taken 20,000 tickets (~313 blocks of 64) when a second sees it.
    const busyKey = `key_behind_${Date.now()}`;
    const first = new RateLimiter(a.store, 1_000_000, 3600, () => now);
    for (let i = 0; i < 20_000; i++) await take(first, busyKey);
    const late = new RateLimiter(b.store, 1_000_000, 3600, () => now);
    expect(await take(late, busyKey)).to.equal(true);
    // Trying every taken block made 320 writes (measured); jumping twice as far each time, about ten.
    expect(late.claimWrites).to.be.within(3, 12);

    // A small limit, so that the window's last block is reached: blocks of 10, one per write.
    now += 3_600_000;
    const key = `key_holes_${Date.now()}`;
    const p1 = new RateLimiter(a.store, 640, 3600, () => now);
    const p2 = new RateLimiter(b.store, 640, 3600, () => now);
    let admitted = 0;
    for (let i = 0; i < 300; i++) if (await take(p1, key)) admitted++;
    // p2 jumps past p1's 31 blocks (0, 1, 3, 6, 11, 20, 37), over some free ones (31-36).
    expect(await take(p2, key)).to.equal(true);
    admitted++;
    expect(p2.claimWrites).to.equal(7);
    // Alone, p2 takes the rest of the window, then the free blocks it jumped over: every block is
    // claimed before it refuses. Then p1 uses the tickets it still holds, and nothing more.
    while (await take(p2, key)) admitted++;
    const blocks = p1.blocksOf(Math.floor(now / 3_600_000));
    expect(await blocks.countDocuments({ key_id: key })).to.equal(64);
    while (await take(p1, key)) admitted++;
    expect(admitted).to.equal(640);
  });

  it("deletes a finished window's blocks by id when the key is next seen", async () => {
    let now = 1_000_000_000_000;
    const limiter = new RateLimiter(a.store, 128, 60, () => now);
    const key = `key_retire_${Date.now()}`;
    const window = Math.floor(now / 60_000);
    const blocks = limiter.blocksOf(window);
    for (let i = 0; i < 5; i++) await limiter.take(key);
    // Blocks of 2, and one more claimed ahead of need.
    expect(await blocks.countDocuments({ key_id: key, window })).to.be.within(3, 4);
    now += 60_000;
    expect(await limiter.take(key)).to.include({ allowed: true, remaining: 127 });
    for (let i = 0; i < 50 && (await blocks.countDocuments({ key_id: key, window })) !== 0; i++)
      await new Promise((r) => setTimeout(r, 20));
    expect(await blocks.countDocuments({ key_id: key, window })).to.equal(0);
    // The new window's block, in the same day's collection.
    expect(limiter.blocksOf(window + 1).collectionName).to.equal(blocks.collectionName);
    expect(await blocks.countDocuments({ key_id: key })).to.equal(1);
  });

  it("drops the blocks nobody will delete (a stopped process's) with their day's collection, two days on, without reading them", async () => {
    const day = 86_400_000;
    const collections = async () =>
      (await a.store.db.listCollections({}, { nameOnly: true }).toArray()).map((c) => c.name).filter((n) => n.startsWith('rate_tickets'));
    let now = 1_100_000_000_000;
    // A process that stops holding blocks of day 0; its key is never seen again.
    const stopped = new RateLimiter(a.store, 600, 60, () => now);
    await stopped.take('key_gone');
    const dayZero = stopped.blocksOf(Math.floor(now / 60_000)).collectionName;
    // As earlier versions kept every window's blocks.
    await a.store.db.collection('rate_tickets').insertOne({ _id: 'key_old:1:b0', key_id: 'key_old', window: 1 } as never);
    await stopped.oldPeriodsDropped;
    // A day on, a new process: day 0 may still hold windows in use (a clock behind), so it stays.
    now += day;
    const next = new RateLimiter(a.store, 600, 60, () => now);
    await next.take('key_live');
    await next.oldPeriodsDropped;
    const dayOne = next.blocksOf(Math.floor(now / 60_000)).collectionName;
    expect(await collections())
      .to.include.members([dayZero, dayOne])
      .and.not.include('rate_tickets');
    // Two days on, day 0 goes; a limit of another window length keeps its own collections.
    const hourly = new RateLimiter(a.store, 600, 3600, () => now);
    await hourly.take('key_hourly');
    now += day;
    const third = new RateLimiter(a.store, 600, 60, () => now);
    await third.take('key_live');
    await third.oldPeriodsDropped;
    const names = await collections();
    expect(names)
      .to.include(dayOne)
      .and.include(hourly.blocksOf(Math.floor((now - day) / 3_600_000)).collectionName);
    expect(names).to.not.include(dayZero);
    // Limits still count in the new day: no block of the old days is in the way.
    expect(await third.take('key_live')).to.include({ allowed: true, remaining: 598 });
  });
});

describe('usage ledger with group commit', () => {
  let store: Store;
  before(async () => {
    store = await Store.connect(stack.mongoUri, uniqueName('ledger').replace(/-/g, '_'));
  });
  after(async () => {
    await store.close();
  });

  const usage = (id: string) => usageRecord(id, 'ws-ledger', 'key-ledger', 0.01);

  it('records that arrive together share one write; each resolves once its own record is stored', async () => {
    const ledger = new UsageLedger(store);
    const ids = Array.from({ length: 200 }, (_, i) => `gen-group-${Date.now()}-${i}`);
    const settled = await Promise.all(
      ids.map(async (id) => {
        const ok = await ledger.record(usage(id));
        // Durable before the caller hears of it.
        return ok && (await store.usage.countDocuments({ _id: id })) === 1;
      }),
    );
    expect(settled.every(Boolean)).to.equal(true);
    expect(ledger.writes).to.be.at.most(2);
  });

  it('journaled records that arrive one at a time gather for their group, during a write too: not one insert per record or two', async () => {
    const journal = new UsageJournal(path.join(stack.tmpDir, uniqueName('trickle')), store.db.databaseName);
    const ledger = new UsageLedger(store, { journal });
    const ids = Array.from({ length: 60 }, (_, i) => `gen-trickle-${Date.now()}-${i}`);
    const started = performance.now();
    for (const id of ids) {
      expect(await ledger.record(usage(id))).to.equal(true); // journaled: answered at once
      await new Promise((r) => setTimeout(r, 1)); // the next call, a moment later
    }
    const elapsedMs = performance.now() - started;
    await ledger.flushed();
    expect(await store.usage.countDocuments({ _id: { $in: ids } })).to.equal(ids.length);
    // One insert per group window at most (and the last one's): written as soon as the previous
    // insert finished, the records that arrived during it went alone, 30–60 inserts for these 60.
    expect(ledger.writes, `${ledger.writes} inserts in ${Math.round(elapsedMs)} ms`).to.be.at.most(
      Math.ceil(elapsedMs / JOURNAL_GROUP_MS) + 2,
    );
    await ledger.close(1_000);
  });

  it('a lone record is written at once, and a repeated generation is not debited twice', async () => {
    const ledger = new UsageLedger(store);
    const id = `gen-lone-${Date.now()}`;
    expect(await ledger.record(usage(id))).to.equal(true);
    const again = await Promise.all([ledger.record(usage(id)), ledger.record(usage(id)), new UsageLedger(store).record(usage(id))]);
    expect(again).to.deep.equal([false, false, false]);
    expect(await store.usage.countDocuments({ _id: id })).to.equal(1);
  });

  it('a write that fails as a whole rejects every record of its group', async () => {
    const broken = await Store.connect(stack.mongoUri, uniqueName('ledger').replace(/-/g, '_'));
    await broken.close();
    const ledger = new UsageLedger(broken);
    const outcomes = await Promise.allSettled([ledger.record(usage('gen-x-1')), ledger.record(usage('gen-x-2'))]);
    expect(outcomes.map((o) => o.status)).to.deep.equal(['rejected', 'rejected']);
  });
});

describe('decision usage under load (inline mode)', () => {
  let gw: TestGateway;
  before(async () => {
    gw = await startTestGateway({ withWorker: false, env: { RATE_LIMIT_REQUESTS: '100000' } });
  });
  after(async () => {
    await gw.stop();
  });

  it('1,000 concurrent decisions make exactly 1,000 usage records and the matching debit', async function () {
    this.timeout(120_000);
    const t = await createTenant(gw.store, 100);
    const responses = await Promise.all(
      Array.from({ length: 1_000 }, () => call(`${gw.url}/api/v1/systemone`, { key: t.inferenceKey, body: decision })),
    );
    expect(responses.map((r) => r.status).filter((s) => s !== 200)).to.deep.equal([]);
    const ids = new Set(responses.map((r) => r.body.id));
    expect(ids.size).to.equal(1_000);
    await gw.usage.flushed(); // journaled before each answer; stored in groups
    const records = await storedUsage(gw.store, { workspace_id: t.workspaceId });
    expect(records).to.have.length(1_000);
    expect(new Set(records.map((r) => r._id))).to.deep.equal(ids);
    const billed = responses.reduce((s, r) => s + r.body.usage.cost, 0);
    const balance = await getBalance(gw.store, t.workspaceId);
    expect(balance.total_usage).to.be.closeTo(billed, 1e-9);
    expect(balance.balance).to.be.closeTo(100 - billed, 1e-9);
  });
});

/** `gateway api` in a process of its own (so it can be SIGKILLed), once it is ready. */
async function startApiProcess(env: Record<string, string | undefined>) {
  const { proc, url } = await startGatewayProcess('gateway', ['api'], {
    TEMPORAL_ADDRESS: stack.temporalAddress,
    SANDBOX_URL: stack.sandboxUrl,
    ...env,
  });
  return { gateway: proc, url };
}

/** Generation ids of the records in a usage-journal directory. */
function journaledIds(dir: string): string[] {
  return fs
    .readdirSync(dir)
    .filter((f) => f.endsWith('.ndjson'))
    .flatMap((f) => fs.readFileSync(path.join(dir, f), 'utf8').split('\n').filter(Boolean))
    .map((l) => JSON.parse(l)._id as string);
}

describe('a gateway killed right after answering', () => {
  it('has made durable the usage record of every decision it answered, and the next start stores it', async function () {
    this.timeout(120_000);
    const database = uniqueName('killed').replace(/-/g, '_');
    const store = await Store.connect(stack.mongoUri, database);
    const t = await createTenant(store, 10);
    const { gateway, url } = await startApiProcess({
      MONGODB_URI: stack.mongoUri,
      MONGODB_DATABASE: database,
      DECISIONS_EXECUTION: 'inline',
      DATA_DIR: path.join(stack.tmpDir, database),
    });
    try {
      const answered: string[] = [];
      let killed = false;
      // Many decisions in flight; the first answer triggers SIGKILL, so the rest die mid-way.
      await Promise.all(
        Array.from({ length: 40 }, async () => {
          try {
            const r = await call(`${url}/api/v1/systemone`, { key: t.inferenceKey, body: decision });
            if (r.status === 200) {
              answered.push(r.body.id);
              if (!killed) {
                killed = true;
                await gateway.kill();
              }
            }
          } catch {
            /* connection reset by the kill */
          }
        }),
      );
      expect(killed).to.equal(true);
      expect(answered.length).to.be.at.least(1);
      // Each answered decision's record was journaled before its answer: stored by the database
      // already, or by the next process on the same data (which adopts the journal at start).
      const dataDir = path.join(stack.tmpDir, database);
      const inJournal = fs.existsSync(path.join(dataDir, 'usage-journal')) ? journaledIds(path.join(dataDir, 'usage-journal')) : [];
      const stored = await storedUsage(store, { _id: { $in: answered } });
      expect([...new Set([...stored.map((d) => d._id), ...inJournal.filter((id) => answered.includes(id))])].sort()).to.deep.equal(
        [...answered].sort(),
      );
      const next = await startApiProcess({ MONGODB_URI: stack.mongoUri, MONGODB_DATABASE: database, DATA_DIR: dataDir });
      try {
        await next.gateway.waitUntil(
          async () => {
            const n = await store.usage.countDocuments({ _id: { $in: answered } });
            if (n !== answered.length) throw new Error(`${n} of ${answered.length} stored`);
          },
          30_000,
          'storing the journaled records',
        );
      } finally {
        await next.gateway.stop();
      }
    } finally {
      await gateway.stop();
      await store.close();
    }
  });
});

describe('a gateway killed mid-stream', () => {
  it('bills each cut stream for what it produced, from its journaled checkpoint, at the next start', async function () {
    this.timeout(120_000);
    const database = uniqueName('cut').replace(/-/g, '_');
    const store = await Store.connect(stack.mongoUri, database);
    const t = await createTenant(store, 10);
    const catalog = writeTestCatalog('cut', (c) => {
      // Each stream runs ~20 s (1,000 words, one an event, an event per 20 ms), far longer than it
      // takes every stream to deliver the bytes read before the kill. The request's max_tokens sets
      // the length: without it the sandbox stops at 16 words (0.4 s), and a stream that started late
      // on a loaded machine let another finish first (max_words alone did not lengthen them).
      c.providers.push(providerEntry('slow-stream', '${SANDBOX_URL}/~chunk_delay=20,max_words=1000/openai/v1', { max_concurrency: 100 }));
      c.models.push(modelEntry('test/slow-stream', [endpointEntry('slow-stream', 1, { supported_parameters: ['max_tokens'] })]));
    });
    const env = {
      MONGODB_URI: stack.mongoUri,
      MONGODB_DATABASE: database,
      CATALOG_PATH: catalog,
      DATA_DIR: path.join(stack.tmpDir, `${database}-gateway`),
    };
    let { gateway, url } = await startApiProcess(env);
    try {
      // 20 streams, each read until it has delivered a few hundred bytes of content.
      const ids = await Promise.all(
        Array.from({ length: 20 }, async () => {
          const res = await fetch(`${url}/api/v1/chat/completions`, {
            method: 'POST',
            headers: { authorization: `Bearer ${t.inferenceKey}`, 'content-type': 'application/json' },
            body: JSON.stringify({
              model: 'test/slow-stream',
              stream: true,
              max_tokens: 1000,
              messages: [{ role: 'user', content: 'tell me' }],
            }),
          });
          expect(res.status).to.equal(200);
          const reader = res.body!.getReader();
          let seen = 0;
          while (seen < 2_000) seen += (await reader.read()).value?.length ?? 0;
          reader.read().catch(() => undefined); // the rest is cut by the kill
          return res.headers.get('x-generation-id')!;
        }),
      );
      await new Promise((r) => setTimeout(r, 100));
      await gateway.kill();
      expect(await store.usage.countDocuments({ _id: { $in: ids } }), 'nothing billed before the restart').to.equal(0);

      ({ gateway, url } = await startApiProcess(env));
      let billed: UsageDoc[] = [];
      for (let i = 0; i < 100 && billed.length < ids.length; i++) {
        billed = await storedUsage(store, { _id: { $in: ids } });
        if (billed.length < ids.length) await new Promise((r) => setTimeout(r, 50));
      }
      expect(billed.map((d) => d._id).sort()).to.deep.equal([...ids].sort());
      for (const d of billed) {
        expect(d.output_tokens, JSON.stringify(d)).to.be.greaterThan(0);
        expect(d.cost).to.be.greaterThan(0);
        expect(usageDetails(d)!.ending).to.equal('gateway_stopped');
      }
    } finally {
      await gateway.stop();
      await store.close();
    }
  });

  it('a stream that finishes is billed once, by its own record: its checkpoints are dropped', async function () {
    this.timeout(60_000);
    const database = uniqueName('whole').replace(/-/g, '_');
    const dir = path.join(stack.tmpDir, `${database}-journal`);
    const gw = await startTestGateway({ withWorker: false, env: { MONGODB_DATABASE: database, DATA_DIR: dir } });
    try {
      const t = await createTenant(gw.store, 10);
      const res = await fetch(`${gw.url}/api/v1/chat/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${t.inferenceKey}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'sandbox/chat-1', stream: true, messages: [{ role: 'user', content: 'hello' }] }),
      });
      await res.text();
      await gw.usage.flushed();
      const id = res.headers.get('x-generation-id')!;
      const doc = await storedRecord(gw.store, id);
      expect(usageDetails(doc!)!.ending).to.equal('completed');
      expect(await gw.store.usage.countDocuments({ _id: id })).to.equal(1);
    } finally {
      await gw.stop();
    }
    // Nothing left in the journal once closed: the record is stored and the checkpoint released.
    expect(fs.readdirSync(path.join(dir, 'usage-journal')).filter((f) => f.endsWith('.ndjson'))).to.deep.equal([]);
  });
});

/** A store whose usage inserts wait until `open()` is called (a database that has stopped answering writes). */
function gatedStore(store: Store): { store: Store; open: () => void } {
  let open!: () => void;
  const gate = new Promise<void>((resolve) => (open = resolve));
  const gated = storeWith(store, 'usage', (usage) => ({
    insertMany: async (...args: Parameters<typeof usage.insertMany>) => (await gate, usage.insertMany(...args)),
  }));
  return { store: gated, open };
}

describe('usage ledger with a journal', () => {
  let store: Store;
  let dir: string;
  const database = uniqueName('journal').replace(/-/g, '_');
  before(async () => {
    store = await Store.connect(stack.mongoUri, database);
  });
  beforeEach(() => {
    dir = path.join(stack.tmpDir, uniqueName('journal'));
  });
  after(async () => {
    await store.close();
  });
  const usage = (id: string, cost = 0.01) => usageRecord(id, 'ws-journal', 'key-journal', cost);
  const journaled = () => journaledIds(dir);

  it('answers once the record is journaled, shows it until stored, then stores it and leaves nothing behind', async () => {
    const { store: slow, open } = gatedStore(store);
    const ledger = new UsageLedger(slow, { journal: new UsageJournal(dir, database) });
    const id = `gen-journal-${Date.now()}`;
    expect(await ledger.record(usage(id, 0.25))).to.equal(true);
    // The database has not taken it: the journal has, and the ledger still shows it.
    expect(await store.usage.countDocuments({ _id: id })).to.equal(0);
    expect(journaled()).to.deep.equal([id]);
    expect((await ledger.generation('ws-journal', id))?.cost).to.equal(0.25);
    expect(await ledger.generation('ws-other', id)).to.equal(null);
    expect(ledger.unstoredCost('ws-journal')).to.equal(0.25);

    open();
    await ledger.flushed();
    const stored = await storedRecord(store, id);
    expect(stored?.cost).to.equal(0.25);
    expect(stored?.created_at).to.be.instanceOf(Date);
    expect(ledger.unstoredCost('ws-journal')).to.equal(0);
    await ledger.close(1_000);
    expect(fs.readdirSync(dir)).to.deep.equal([]);
  });

  it('refuses records (503) once those waiting for the database hold its memory bound, counted by size, and takes them again once stored', async () => {
    const { store: slow, open } = gatedStore(store);
    const ledger = new UsageLedger(slow, { journal: new UsageJournal(dir, database), maxBacklogBytes: 8 * 1024 });
    // One record bigger than the bound is refused with nothing else waiting: the bound is memory, not a count.
    const big = { ...usage(`gen-big-${Date.now()}`), trace: { x: 'v'.repeat(8 * 1024) } };
    const refusedBig = await ledger.record(big).catch((err: unknown) => err);
    expect(refusedBig).to.be.instanceOf(ServiceUnavailableError);
    // Small ones are taken until the bound is reached (each ~1.3 KB counted), then refused.
    const taken: string[] = [];
    let refused: unknown = null;
    for (let i = 0; i < 20 && !refused; i++) {
      const id = `gen-bound-${Date.now()}-${i}`;
      refused = await ledger.record(usage(id)).then(
        () => (taken.push(id), null),
        (err: unknown) => err,
      );
    }
    expect(refused).to.be.instanceOf(ServiceUnavailableError);
    expect((refused as ServiceUnavailableError).status).to.equal(503);
    expect(taken.length).to.be.within(3, 7);
    expect(journaled().sort()).to.deep.equal([...taken].sort()); // nothing refused was journaled
    expect(ledger.backlogBytes).to.be.within(1, 8 * 1024);
    // Once the database has them, their memory is free again.
    open();
    await ledger.flushed();
    expect(ledger.backlogBytes).to.equal(0);
    expect(await ledger.record(usage(`gen-bound-after-${Date.now()}`))).to.equal(true);
    await ledger.flushed();
    await ledger.close(1_000);
  });

  it('records finished in one turn of the event loop share one write(2); each caller is answered only once its line is written', async () => {
    const { store: slow, open } = gatedStore(store);
    const journal = new UsageJournal(dir, database);
    const ledger = new UsageLedger(slow, { journal });
    const ids = Array.from({ length: 50 }, (_, i) => `gen-turn-${Date.now()}-${i}`);
    const before = journal.writes;
    const seen: string[][] = [];
    await Promise.all(ids.map((id) => ledger.record(usage(id)).then(() => seen.push(journaled()))));
    expect(journal.writes - before).to.equal(1);
    // Every caller, when answered, found its own line (and all the others of its turn) in the file.
    for (const lines of seen) expect([...lines].sort()).to.deep.equal([...ids].sort());
    // A record of a later turn is a write of its own.
    await ledger.record(usage(`gen-turn-later-${Date.now()}`));
    expect(journal.writes - before).to.equal(2);
    open();
    await ledger.flushed();
    expect(await store.usage.countDocuments({ _id: { $in: ids } })).to.equal(50);
    await ledger.close(1_000);
    expect(fs.readdirSync(dir)).to.deep.equal([]);
  });

  it('records left in the journal of a stopped process are stored by the next one, once each, for its own database only', async () => {
    const { store: stuck } = gatedStore(store);
    const first = new UsageLedger(stuck, { journal: new UsageJournal(dir, database) });
    const ids = [1, 2, 3].map((i) => `gen-left-${Date.now()}-${i}`);
    // Details keyed by a caller's question names, one of which Extended JSON would read as a date.
    const details = { providers: { $date: 'sandbox', q2: 'other' } };
    for (const id of ids) await first.record({ ...usage(id), details });
    await store.usage.insertOne(toStoredUsage({ ...usage(ids[0]), created_at: new Date() } as UsageDoc)); // one got through before the stop
    await first.close(0); // the database never answered: the journal keeps all three
    expect(journaled()).to.have.length(3);

    // A process of another database leaves them alone.
    const other = new UsageLedger(store, { journal: new UsageJournal(dir, `${database}_other`) });
    await other.flushed();
    expect(journaled()).to.have.length(3);
    await other.close(1_000);

    const trouble: string[] = [];
    const next = new UsageLedger(store, { journal: new UsageJournal(dir, database), onTrouble: (m) => trouble.push(m) });
    await next.flushed();
    expect(trouble).to.include('adopted a usage journal left by a stopped process');
    const adopted = await storedUsage(store, { _id: { $in: ids } });
    expect(adopted.map((d) => d._id).sort()).to.deep.equal([...ids].sort());
    expect(usageDetails(adopted.find((d) => d._id === ids[2])!)).to.deep.equal(details); // came back through the journal
    expect(journaled()).to.deep.equal([]);
    await next.close(1_000);
    expect(fs.readdirSync(dir)).to.deep.equal([]);
  });

  it('a journal that cannot be written (a full disk): each record is in the database before its answer, and journaled again once it can be', async () => {
    const { store: slow, open } = gatedStore(store);
    const journal = new UsageJournal(dir, database);
    const trouble: string[] = [];
    const ledger = new UsageLedger(slow, { journal, onTrouble: (m) => trouble.push(m) });
    // The next segments are /dev/full: every write to them fails with ENOSPC.
    const segments = [0, 1, 2, 3].map((n) => path.join(dir, `${journal.instance}.${n}.ndjson`));
    for (const file of segments) fs.symlinkSync('/dev/full', file);
    open();
    const ids = [1, 2].map((i) => `gen-full-${Date.now()}-${i}`);
    for (const id of ids) {
      expect(await ledger.record(usage(id))).to.equal(true);
      expect(await store.usage.countDocuments({ _id: id })).to.equal(1); // stored when it answered
    }
    expect(trouble).to.deep.equal(['usage journal cannot be written: each usage record goes to the database before its answer']);
    expect(ledger.journalFailing).to.equal(true);
    // Each failed segment was given up: a line after a cut one would be lost with it.
    expect(segments.map((f) => fs.existsSync(f))).to.deep.equal([false, false, true, true]);
    for (const file of segments) fs.rmSync(file, { force: true });

    // Writable again: journaled, and said so once.
    const after = `gen-full-after-${Date.now()}`;
    expect(await ledger.record(usage(after))).to.equal(true);
    expect(journaled()).to.deep.equal([after]);
    expect(trouble.at(-1)).to.equal('usage journal written again');
    expect(ledger.journalFailing).to.equal(false);
    await ledger.flushed();
    expect(await store.usage.countDocuments({ _id: { $in: [...ids, after] } })).to.equal(3);
    await ledger.close(1_000);
  });

  it('keeps journaled records through a database outage and stores them when it is back', async () => {
    const broken = await Store.connect(stack.mongoUri, database);
    await broken.close(); // every write fails at once, as with the database down
    let failed!: (message: string) => void;
    const firstTrouble = new Promise<string>((resolve) => (failed = resolve));
    const ledger = new UsageLedger(broken, { journal: new UsageJournal(dir, database), onTrouble: (m) => failed(m) });
    const id = `gen-outage-${Date.now()}`;
    expect(await ledger.record(usage(id))).to.equal(true);
    expect(await firstTrouble).to.equal('usage records could not be stored; retrying');
    await ledger.close(200); // still retrying in the background when it stops
    expect(journaled()).to.deep.equal([id]);

    const next = new UsageLedger(store, { journal: new UsageJournal(dir, database) });
    await next.flushed();
    expect(await store.usage.countDocuments({ _id: id })).to.equal(1);
    await next.close(1_000);
  });

  it('one ledger serves both kinds of caller: recordStored answers once stored (or refused), record once journaled', async () => {
    const ledger = new UsageLedger(store, { journal: new UsageJournal(dir, database) });
    const stored = `gen-stored-${Date.now()}`;
    expect(await ledger.recordStored(usage(stored))).to.equal(true);
    expect(await store.usage.countDocuments({ _id: stored })).to.equal(1); // in the database when it answered
    expect(journaled()).to.deep.equal([]); // and never journaled
    await ledger.close(1_000);

    // In an outage a caller waiting for the database is refused (its activity retries); a journaled record waits.
    const broken = await Store.connect(stack.mongoUri, database);
    await broken.close();
    const during = new UsageLedger(broken, { journal: new UsageJournal(dir, database), onTrouble: () => undefined });
    const [waiting, kept] = [`gen-refused-${Date.now()}`, `gen-kept-${Date.now()}`];
    const refused = during.recordStored(usage(waiting)).catch((err: Error) => err);
    expect(await during.record(usage(kept))).to.equal(true);
    expect(await refused).to.be.instanceOf(Error);
    await during.close(200);
    expect(journaled()).to.deep.equal([kept]);
    const next = new UsageLedger(store, { journal: new UsageJournal(dir, database) });
    await next.flushed();
    expect(await store.usage.countDocuments({ _id: { $in: [waiting, kept] } })).to.equal(1);
    await next.close(1_000);
  });
});

/** A FerretDB of the test's own (so it can be frozen with SIGSTOP), with a store and a funded tenant on it. */
async function ownDatabase(name: string) {
  const database = uniqueName(name).replace(/-/g, '_');
  const ferret = await startFerretDB({ binary: stack.tools!.ferretdb, port: await freePort(), dataDir: path.join(stack.tmpDir, database) });
  const store = await Store.connect(ferret.address, database);
  const t = await createTenant(store, 10);
  const signal = (sig: NodeJS.Signals) => {
    try {
      process.kill(ferret.process.pid!, sig);
    } catch {
      /* gone */
    }
  };
  return {
    database,
    address: ferret.address,
    store,
    t,
    freeze: () => signal('SIGSTOP'),
    thaw: () => signal('SIGCONT'),
    close: async () => {
      signal('SIGCONT');
      await store.close();
      await ferret.process.stop();
    },
  };
}

describe('a gateway killed while its database is frozen', () => {
  it('while the database is frozen: known keys are served (past their cache time too), rate limits fail open, what needs the database is a quick 503, nothing a 500', async function () {
    this.timeout(120_000);
    const { database, address, t, freeze, close } = await ownDatabase('outage');
    const { gateway, url } = await startApiProcess({
      MONGODB_URI: address,
      MONGODB_DATABASE: database,
      KEY_CACHE_MS: '1000',
      RATE_LIMIT_REQUESTS: '60', // single-ticket blocks: every request claims one from the database
      DATA_DIR: path.join(stack.tmpDir, `${database}-gateway`),
    });
    const chat = (key: string, extra: Record<string, unknown> = {}) =>
      call(`${url}/api/v1/chat/completions`, {
        key,
        body: { model: 'sandbox/chat-1', messages: [{ role: 'user', content: 'hello' }], max_tokens: 5, ...extra },
      });
    try {
      for (let i = 0; i < 3; i++) expect((await chat(t.inferenceKey)).status).to.equal(200);
      freeze();
      await new Promise((r) => setTimeout(r, 1500)); // the key's cache time has passed
      const started = Date.now();
      const answers = await Promise.all(Array.from({ length: 40 }, () => chat(t.inferenceKey)));
      const took = Date.now() - started;
      expect(
        answers.map((a) => a.status),
        `${JSON.stringify(answers.find((a) => a.status !== 200)?.body)}\n${gateway.recentOutput().slice(-3000)}`,
      ).to.deep.equal(answers.map(() => 200));
      expect(took, `40 calls took ${took} ms`).to.be.below(10_000);
      // Single-ticket blocks: each of the 40 needed a claim the frozen database never answered.
      expect(await uncheckedAdmissions(url)).to.be.at.least(40);
      // An unknown key, and a preset, need the database: a 503 in the envelope, not a 500.
      for (const [key, extra] of [
        ['sk-gw-v1-' + '0'.repeat(64), {}],
        [t.inferenceKey, { model: '@preset/none' }],
      ] as const) {
        const asked = Date.now();
        const r = await chat(key, extra);
        expect(r.status, JSON.stringify(r.body)).to.equal(503);
        expect(r.body.error.code).to.equal(503);
        expect(r.body.error.message).to.match(/database is unavailable/);
        // Found out by the driver's own checks (every 2 s, given up after 2 s), not after a long timeout.
        expect(Date.now() - asked).to.be.below(8_000);
      }
    } finally {
      await gateway.stop();
      await close();
    }
  });

  it('answered chat calls from its journal, and its next start stores every one of them', async function () {
    this.timeout(120_000);
    const { database, address, store, t, freeze, thaw, close } = await ownDatabase('frozen');
    const env = {
      MONGODB_URI: address,
      MONGODB_DATABASE: database,
      RATE_LIMIT_REQUESTS: '100000', // tickets claimed ahead, so admission needs no write while frozen
      DATA_DIR: path.join(stack.tmpDir, `${database}-gateway`),
    };
    const start = () => startApiProcess(env);
    const chat = (url: string) =>
      call(`${url}/api/v1/chat/completions`, {
        key: t.inferenceKey,
        body: { model: 'sandbox/chat-1', messages: [{ role: 'user', content: 'hello' }], max_tokens: 5 },
      });
    let { gateway, url } = await start();
    try {
      for (let i = 0; i < 3; i++) expect((await chat(url)).status).to.equal(200); // caches and tickets warm
      freeze();
      const answered: string[] = [];
      for (let i = 0; i < 5; i++) {
        const r = await chat(url);
        expect(r.status, JSON.stringify(r.body)).to.equal(200);
        answered.push(r.headers.get('x-generation-id')!);
      }
      await gateway.kill();
      // Every answered call is in the dead process's journal. (An insert already sent may still
      // reach the database when it thaws: the next start's copy is then a duplicate, not a second debit.)
      expect(journaledIds(path.join(env.DATA_DIR, 'usage-journal'))).to.include.members(answered);
      thaw();

      ({ gateway, url } = await start());
      let stored: string[] = [];
      for (let i = 0; i < 100 && stored.length < answered.length; i++) {
        stored = (await storedUsage(store, { _id: { $in: answered } })).map((d) => d._id);
        if (stored.length < answered.length) await new Promise((r) => setTimeout(r, 50));
      }
      expect(stored.sort()).to.deep.equal([...answered].sort());
      expect(await store.usage.countDocuments({ workspace_id: t.workspaceId })).to.equal(3 + answered.length);
      const g = await call(`${url}/api/v1/generation?id=${answered[0]}`, { key: t.inferenceKey });
      expect(g.status).to.equal(200);
    } finally {
      await gateway.stop();
      await close();
    }
  });
});
