// Bounded spend: each billable decision holds an estimate of its cost before the provider is
// called, so concurrent calls cannot overspend a workspace by more than one estimate per process.
import { expect } from 'chai';
import { Store } from '../infrastructure/store';
import { PaymentRequiredError } from '../infrastructure/errors';
import { UsageLedger } from '../domain/accounts/usage-ledger';
import { SpendAdmission, type Hold } from '../domain/accounts/spend-admission';
import { estimateDecisionCost } from '../domain/decisions/estimate';
import { Catalog } from '../domain/catalog';
import { DEFAULT_CATALOG_PATH } from '../infrastructure/config';
import { stack } from './fixture';
import {
  call,
  createTenant,
  startTestGateway,
  uniqueName,
  usageRecord,
  waitForStatus,
  writeTestCatalog,
  storedUsage,
  streamLeftEarly,
  billedBatchLine,
  sseJson,
  type TestGateway,
} from './helpers';
import { endpointEntry, modelEntry, providerEntry } from '../domain/catalog/entries';
import { costOf } from '../domain/catalog/usd';

const question = { q: { type: 'noul', instructions: 'Is this a complaint?' } };

describe('holds against a workspace balance', () => {
  let store: Store;
  before(async () => {
    store = await Store.connect(stack.mongoUri, uniqueName('db').replace(/-/g, '_'));
  });
  after(async () => {
    await store.close();
  });

  it('a billed call settles to its cost, and a failed one releases its hold at once', async () => {
    const t = await createTenant(store, 1);
    const cache = new SpendAdmission(store, 60_000, Date.now, () => 0, 50);
    const signal = new AbortController().signal;
    const boom = await cache.billed(t.workspaceId, 1, signal, () => Promise.reject(new Error('provider down'))).catch((e: Error) => e);
    expect(boom).to.be.instanceOf(Error).with.property('message', 'provider down');
    // Released: the whole balance is available again (still held, it would leave nothing: a 402 after 50 ms).
    await cache.billed(t.workspaceId, 1, signal, async () => 0.25);
    expect((await cache.balance(t.workspaceId)).balance).to.equal(0.75);
  });

  it('admits while something is left, counting held and settled spending; waits while the rest is only held; 402 once spent', async () => {
    const t = await createTenant(store, 1);
    const cache = new SpendAdmission(store, 60_000);
    const ledger = new UsageLedger(store);
    // A call that finishes: its record is stored, then its hold settles to the real cost.
    const bill = async (h: Hold, cost: number) => {
      await ledger.record(usageRecord(`gen-hold-${uniqueName('c')}`, t.workspaceId, t.inferenceKeyId, cost));
      h.settle(cost);
    };
    const a = await cache.hold(t.workspaceId, 0.4);
    const b = await cache.hold(t.workspaceId, 0.4);
    const c = await cache.hold(t.workspaceId, 0.4); // 0.2 was left: admitted, the one estimate of overspend
    // Nothing is spent yet: the next call is not refused, it waits for a hold to end.
    let admitted = false;
    const waiting = cache.hold(t.workspaceId, 0.4).then((h) => ((admitted = true), h));
    await new Promise((r) => setTimeout(r, 50));
    expect(admitted, 'admitted past what holds leave').to.equal(false);
    a.release(); // that call billed nothing: 1 - 0.8 held = 0.2 left, so the waiting call goes in
    const d = await waiting;
    await bill(b, 0.1); // and that one cost less than it held
    await bill(c, 0.4);
    await bill(d, 0.4);
    // 0.9 spent: 0.1 is left, enough for one more call of 0.1 and no further.
    await bill(await cache.hold(t.workspaceId, 0.1), 0.1);
    const refused = await cache.hold(t.workspaceId, 0.1).then(
      () => expect.fail('admitted with nothing left'),
      (err) => err,
    );
    expect(refused.status).to.equal(402);
    // The balance reported is the real one, not one less the estimates held.
    expect(refused.metadata.balance).to.equal(0);
  });

  it('a call waiting for holds is refused after the wait allowance, naming the real balance', async () => {
    const t = await createTenant(store, 1);
    const cache = new SpendAdmission(store, 60_000, Date.now, () => 0, 100);
    const h = await cache.hold(t.workspaceId, 5); // one call holds more than the balance
    const started = Date.now();
    const err = await cache.hold(t.workspaceId, 5).then(
      () => expect.fail('admitted past the hold'),
      (e) => e,
    );
    expect(Date.now() - started).to.be.at.least(90);
    expect(err.status).to.equal(402);
    expect(err.message).to.match(/held by calls still in flight/);
    expect(err.metadata.balance).to.equal(1);
    h.release();
    (await cache.hold(t.workspaceId, 5)).release();
  });

  it('a batch line waits for credit held by other lines as long as it takes (no client is waiting on it)', async () => {
    const t = await createTenant(store, 1);
    const cache = new SpendAdmission(store, 60_000, Date.now, () => 0, 50);
    const first = await cache.hold(t.workspaceId, 5);
    let admitted = false;
    const line = cache.hold(t.workspaceId, 5, undefined, Infinity).then((h) => ((admitted = true), h));
    await new Promise((r) => setTimeout(r, 200)); // four times a synchronous call's wait
    expect(admitted).to.equal(false);
    first.release();
    (await line).release();
    expect(admitted).to.equal(true);
  });

  it('spending settled before its usage record is stored (a batch line) counts until the record is in the ledger', async () => {
    const t = await createTenant(store, 2);
    const cache = new SpendAdmission(store, 0); // TTL 0: every read goes to the ledger
    const h = await cache.hold(t.workspaceId, 0.1);
    const stored = h.settleUnstored(0.5);
    expect((await cache.balance(t.workspaceId)).balance).to.equal(1.5);
    await new UsageLedger(store).record(usageRecord(`gen-line-${t.workspaceId}`, t.workspaceId, t.inferenceKeyId, 0.5));
    stored();
    expect((await cache.balance(t.workspaceId)).balance).to.equal(1.5);
  });

  it('spending settled while its usage record is still on its way to the ledger is not lost by a re-read', async () => {
    const t = await createTenant(store, 2);
    let unstored = 0;
    const cache = new SpendAdmission(store, 0, Date.now, () => unstored); // TTL 0: every read goes to the ledger
    const h = await cache.hold(t.workspaceId, 0.1);
    unstored = 0.5; // journaled, not yet in the database
    h.settle(0.5);
    expect((await cache.balance(t.workspaceId)).balance).to.equal(1.5);
    await new UsageLedger(store).record(usageRecord(`gen-late-${t.workspaceId}`, t.workspaceId, t.inferenceKeyId, 0.5));
    unstored = 0;
    expect((await cache.balance(t.workspaceId)).balance).to.equal(1.5);
  });

  it('a workspace left unused is forgotten once all it spent is in the ledger, and read afresh when next used; never while spending is on its way', async () => {
    let now = 0;
    const unstored = new Map<string, number>();
    const cache = new SpendAdmission(
      store,
      5_000,
      () => now,
      (ws) => unstored.get(ws) ?? 0,
      15_000,
      60_000,
    );
    const ledger = new UsageLedger(store);
    const [stored, journaled, line, inFlight] = await Promise.all([1, 2, 3, 4].map(() => createTenant(store, 1)));
    // Stored: its record is in the ledger.
    await ledger.record(usageRecord(`gen-idle-${stored.workspaceId}`, stored.workspaceId, stored.inferenceKeyId, 0.25));
    (await cache.hold(stored.workspaceId, 0.1)).settle(0.25);
    // Journaled: settled, its record not in the ledger yet.
    (await cache.hold(journaled.workspaceId, 0.1)).settle(0.5);
    unstored.set(journaled.workspaceId, 0.5);
    // A batch line settled before its record is written.
    const lineStored = (await cache.hold(line.workspaceId, 0.1)).settleUnstored(0.125);
    // A call still in flight.
    const call = await cache.hold(inFlight.workspaceId, 0.5);
    // An hour of other workspaces, one a minute.
    let most = 0;
    for (let i = 0; i < 60; i++) {
      now += 61_000;
      await cache.balance(uniqueName('ws'));
      most = Math.max(most, cache['accounts'].size);
    }
    expect(most, 'workspaces held').to.be.at.most(7);
    const kept = (ws: string) => cache['accounts'].peek(ws) !== undefined;
    expect([stored, journaled, line, inFlight].map((t) => kept(t.workspaceId))).to.deep.equal([false, true, true, true]);
    // Each balance is exact: read afresh for the forgotten one, the kept ones count what is on its way.
    expect((await cache.balance(stored.workspaceId)).balance).to.equal(0.75);
    expect((await cache.balance(journaled.workspaceId)).balance).to.equal(0.5);
    expect((await cache.balance(line.workspaceId)).balance).to.equal(0.875);
    call.settle(0.5);
    await ledger.record(usageRecord(`gen-idle-${inFlight.workspaceId}`, inFlight.workspaceId, inFlight.inferenceKeyId, 0.5));
    // Once their records are in, the rest may go too.
    await ledger.record(usageRecord(`gen-idle-${journaled.workspaceId}`, journaled.workspaceId, journaled.inferenceKeyId, 0.5));
    unstored.delete(journaled.workspaceId);
    await ledger.record(usageRecord(`gen-idle-${line.workspaceId}`, line.workspaceId, line.inferenceKeyId, 0.125));
    lineStored();
    await new Promise((r) => setTimeout(r, 250)); // the re-reads the balances above started (soon.ts) are done
    for (let i = 0; i < 10; i++) {
      now += 61_000;
      await cache.balance(uniqueName('ws'));
    }
    expect([journaled, line, inFlight].map((t) => kept(t.workspaceId))).to.deep.equal([false, false, false]);
    expect((await cache.balance(journaled.workspaceId)).balance).to.equal(0.5);
    expect((await cache.balance(line.workspaceId)).balance).to.equal(0.875);
    expect((await cache.balance(inFlight.workspaceId)).balance).to.equal(0.5);
  });

  /**
   * A workspace of `credits` that spent 0.5 in one call, now in the ledger, seen by a process whose
   * journal answers each ask of what it holds unstored with the next of `unstored` (then 0).
   */
  async function spentHalf(credits: number, ttlMs: number) {
    const t = await createTenant(store, credits);
    const unstored: number[] = [];
    const cache = new SpendAdmission(store, ttlMs, Date.now, () => unstored.shift() ?? 0);
    (await cache.hold(t.workspaceId, 0.1)).settle(0.5);
    await new UsageLedger(store).record(usageRecord(`gen-half-${t.workspaceId}`, t.workspaceId, t.inferenceKeyId, 0.5));
    return { t, cache, unstored };
  }

  it("a 402 names the real balance when this process's records reached the ledger while the reading was in flight", async () => {
    // TTL 0: every read goes to the ledger. The whole credit, journaled, and stored while the next
    // reading runs: not in the ledger as it began, in it as it ended.
    const { t, cache, unstored } = await spentHalf(0.5, 0);
    unstored.push(0.5, 0);
    const refused = await cache.assertCanSpend(t.workspaceId).then(
      () => null,
      (err: PaymentRequiredError) => err,
    );
    expect(refused).to.be.instanceOf(PaymentRequiredError);
    expect(refused!.metadata).to.deep.equal({ balance: 0 });
  });

  it('a 402 names the real balance when records reached the ledger during the re-read too (a full run saw -0.004 for 0)', async () => {
    const { t, cache, unstored } = await spentHalf(0.5, 0);
    // Two readings in a row each see records reach the ledger while they run (the journal stores
    // groups every 50 ms); the third does not.
    unstored.push(0.5, 0, 0.5, 0);
    const refused = await cache.assertCanSpend(t.workspaceId).then(
      () => null,
      (err: PaymentRequiredError) => err,
    );
    expect(refused).to.be.instanceOf(PaymentRequiredError);
    expect(refused!.metadata).to.deep.equal({ balance: 0 });
  });

  it('a balance shown is never one counting spending twice: a reading kept while records reached the ledger through all its re-reads is read again (a full run showed -0.150 for -0.050)', async () => {
    const { t, cache, unstored } = await spentHalf(2, 60_000);
    // Under 10 estimates left: the next hold reads the ledger, and every one of its three reads sees
    // records reach the ledger as it runs. The reading kept counts the 0.5 twice (in the ledger and
    // as spending since it), which for admitting is the safe side: 1.0 left, still admitted.
    unstored.push(0.5, 0, 0.5, 0, 0.5, 0);
    (await cache.hold(t.workspaceId, 0.2)).release();
    expect(unstored, 'three reads').to.deep.equal([]);
    expect(await cache.balance(t.workspaceId)).to.deep.equal({ total_credits: 2, total_usage: 0.5, balance: 1.5 });
  });

  it("a balance is read from the cache plus this process's own spending: one ledger reading, not one per request", async () => {
    const watched = await Store.connect(stack.mongoUri, store.db.databaseName, { monitorCommands: true });
    try {
      const sums: string[] = [];
      watched.client.on('commandStarted', (e) => {
        // The balance's sum is a range of `_id`s (a new ledger also reads its own totals by `_id` once).
        if (e.commandName === 'find' && e.command.filter?._id?.$gte !== undefined) sums.push(String(e.command.find));
      });
      const t = await createTenant(watched, 2);
      const cache = new SpendAdmission(watched, 60_000);
      expect(await cache.balance(t.workspaceId)).to.deep.equal({ total_credits: 2, total_usage: 0, balance: 2 });
      const h = await cache.hold(t.workspaceId, 0.1); // plenty left: no re-read
      await new UsageLedger(watched).record(usageRecord(`gen-own-${t.workspaceId}`, t.workspaceId, t.inferenceKeyId, 0.25));
      h.settle(0.25);
      for (let i = 0; i < 50; i++)
        expect(await cache.balance(t.workspaceId)).to.deep.equal({ total_credits: 2, total_usage: 0.25, balance: 1.75 });
      expect(sums.filter((c) => c === 'usage_totals')).to.have.length(1);
    } finally {
      await watched.close();
    }
  });

  it("near exhaustion a hold re-reads the ledger, so another process's spending is seen at once", async () => {
    const t = await createTenant(store, 1);
    const cache = new SpendAdmission(store, 60_000);
    (await cache.hold(t.workspaceId, 0.01)).release(); // a fresh reading, trusted for a minute
    // Another process spends everything.
    await new UsageLedger(store).record(usageRecord(`gen-elsewhere-${t.workspaceId}`, t.workspaceId, t.inferenceKeyId, 1));
    // 1 USD left by the reading is under 10 estimates of 0.2: the hold re-reads and refuses.
    await cache.hold(t.workspaceId, 0.2).then(
      () => expect.fail('admitted on a stale reading'),
      (err) => expect(err.status).to.equal(402),
    );
  });
});

describe('decision cost estimate', () => {
  it('prices the prompt overhead on the priciest endpoint the model could fall back to', () => {
    const catalog = Catalog.fromFile(DEFAULT_CATALOG_PATH, { SANDBOX_URL: 'http://x' });
    const { model } = catalog.resolve('jev-1.13');
    const estimate = estimateDecisionCost(model, { stateBytes: 20, questions: question as never });
    expect(estimate).to.be.greaterThan(0);
    const prices = model.endpoints.map((e) => e.entry.pricing.prompt);
    expect(estimate).to.be.at.least((Math.max(...prices) * 256) / 1e6);
  });
});

for (const mode of ['inline', 'workflow'] as const)
  describe(`spend bound (DECISIONS_EXECUTION=${mode})`, () => {
    it('50 concurrent decisions against credit for 5 spend no more than the credit plus one estimate', async function () {
      this.timeout(60_000);
      const gw = await startTestGateway({ env: { DECISIONS_EXECUTION: mode } });
      try {
        // One provider, so every call costs the same.
        const body = {
          model: 'jev-1.13',
          state: 'I was charged twice for my subscription',
          questions: question,
          provider: { only: ['sandbox-systemone'] },
        };
        // What one such decision costs, measured in a workspace of its own.
        const probe = await createTenant(gw.store, 1);
        const one = await call(`${gw.url}/api/v1/systemone`, { key: probe.inferenceKey, body });
        expect(one.status, JSON.stringify(one.body)).to.equal(200);
        const cost = one.body.usage.cost;
        const estimate = estimateDecisionCost(
          Catalog.fromFile(DEFAULT_CATALOG_PATH, { SANDBOX_URL: stack.sandboxUrl }).resolve('jev-1.13').model,
          { questions: question as never, stateBytes: Buffer.byteLength(body.state) },
        );
        expect(estimate, 'the estimate covers what a real call was charged').to.be.at.least(cost);

        const t = await createTenant(gw.store, 5 * cost);
        const answers = await Promise.all(
          Array.from({ length: 50 }, () => call(`${gw.url}/api/v1/systemone`, { key: t.inferenceKey, body })),
        );
        const ok = answers.filter((a) => a.status === 200);
        const refused = answers.filter((a) => a.status === 402);
        expect(ok.length + refused.length, JSON.stringify(answers.map((a) => a.status))).to.equal(50);
        expect(ok.length, JSON.stringify({ cost, estimate, costs: ok.map((a) => a.body.usage.cost) })).to.be.within(1, 5);
        expect(refused[0].body.error.message).to.match(/Insufficient credits/);
        await gw.usage.flushed(); // inline decisions are journaled before the answer, stored in groups
        const billed = await storedUsage(gw.store, { workspace_id: t.workspaceId });
        expect(billed).to.have.length(ok.length);
        const spent = billed.reduce((a, u) => a + u.cost, 0);
        expect(spent).to.be.at.most(5 * cost + estimate + 1e-12);
      } finally {
        await gw.stop();
      }
    });
  });

describe('credits under concurrent calls and batches', () => {
  // A model whose every call costs exactly $0.001 (a per-request price), as the estimate says.
  const perCall = 0.001;
  let catalogPath: string;
  before(() => {
    catalogPath = writeTestCatalog('spend', (c) => {
      c.models.push({
        id: 'test/penny',
        name: 'penny',
        kind: 'chat',
        family: 'test/penny',
        version: '1',
        released: '20260101',
        context_length: 8192,
        distillable: true,
        endpoints: [
          {
            provider: 'sandbox-alpha',
            upstream_model: 'sandbox-chat',
            pricing: { prompt: 0, completion: 0, request: perCall },
            quantization: 'bf16',
            supported_parameters: ['max_tokens'],
          },
        ],
      });
    });
  });

  it('120 concurrent uncapped calls on a $0.01 workspace: no 402 while the balance lasts, and a 402 names the real balance', async function () {
    this.timeout(60_000);
    const gw = await startTestGateway({ withWorker: false, env: { CATALOG_PATH: catalogPath } });
    try {
      // Uncapped, each call holds what 16,384 output tokens would cost on the priciest endpoint
      // (~$0.02, twice the credit); each really costs a few hundred-thousandths of a dollar.
      const body = { model: 'sandbox/chat-1', messages: [{ role: 'user', content: 'hello' }] };
      const rich = await createTenant(gw.store, 1);
      const one = await call(`${gw.url}/api/v1/chat/completions`, { key: rich.inferenceKey, body });
      expect(one.status).to.equal(200);
      const t = await createTenant(gw.store, 0.01);
      const answers = await Promise.all(
        Array.from({ length: 120 }, () => call(`${gw.url}/api/v1/chat/completions`, { key: t.inferenceKey, body })),
      );
      const statuses = answers.map((a) => a.status);
      expect(
        statuses.filter((s) => s !== 200),
        JSON.stringify(answers.find((a) => a.status !== 200)?.body),
      ).to.deep.equal([]);

      // A workspace with credit for exactly four calls of a model that costs $0.001 a call: refused
      // only once that is spent, and the 402 names the real balance.
      const poor = await createTenant(gw.store, 4 * perCall);
      const later = await Promise.all(
        Array.from({ length: 30 }, () =>
          call(`${gw.url}/api/v1/chat/completions`, { key: poor.inferenceKey, body: { ...body, model: 'test/penny' } }),
        ),
      );
      const ok = later.filter((a) => a.status === 200);
      const refused = later.filter((a) => a.status === 402);
      expect(ok.length + refused.length).to.equal(30);
      expect(ok.length).to.equal(4);
      for (const r of refused) expect(r.body.error.metadata.balance, JSON.stringify(r.body)).to.equal(0);
    } finally {
      await gw.stop();
    }
  });

  const batchOf = (n: number) => ({
    endpoint: '/v1/chat/completions',
    model: 'test/penny',
    requests: Array.from({ length: n }, (_, i) => ({ custom_id: `r${i}`, body: { messages: [{ role: 'user', content: `line ${i}` }] } })),
  });

  async function runBatch(url: string, t: Awaited<ReturnType<typeof createTenant>>, n: number) {
    const created = await call(`${url}/api/v1/batches`, { key: t.inferenceKey, body: batchOf(n) });
    expect(created.status, JSON.stringify(created.body)).to.equal(202);
    return waitForStatus(url, t.inferenceKey, created.body.id, ['completed', 'failed'], 120_000);
  }

  it('a 2,000-line batch on $0.01 spends at most the credit plus one estimate; the lines past it fail with 402', async function () {
    this.timeout(180_000);
    const gw = await startTestGateway({ env: { CATALOG_PATH: catalogPath } });
    try {
      const t = await createTenant(gw.store, 0.01);
      const done = await runBatch(gw.url, t, 2000);
      expect(done.status).to.equal('completed');
      const spent = (await storedUsage(gw.store, { workspace_id: t.workspaceId })).reduce((a, u) => a + u.cost, 0);
      expect(spent).to.be.at.most(0.01 + perCall + 1e-9);
      expect(done.request_counts.completed).to.be.within(9, 11);
      expect(done.request_counts.failed).to.equal(2000 - done.request_counts.completed);
      const results = await fetch(`${gw.url}/api/v1/batches/${done.id}/results`, {
        headers: { authorization: `Bearer ${t.inferenceKey}` },
      });
      const lines = (await results.text())
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l));
      expect(lines).to.have.length(2000);
      const refused = lines.filter((l) => l.error);
      expect(refused).to.have.length(done.request_counts.failed);
      for (const l of refused) expect(l.error).to.include({ type: 'insufficient_credits', code: 402 });
      expect(refused[0].error.message).to.match(/Insufficient credits/);
    } finally {
      await gw.stop();
    }
  });

  it('with two processes running its lines, a batch spends at most the credit plus one estimate per process', async function () {
    this.timeout(180_000);
    const first = await startTestGateway({ env: { CATALOG_PATH: catalogPath } });
    const second = await startTestGateway({
      env: {
        CATALOG_PATH: catalogPath,
        MONGODB_DATABASE: first.config.mongo.database,
        TEMPORAL_TASK_QUEUE: first.config.temporal.taskQueue,
      },
    });
    try {
      const t = await createTenant(first.store, 0.01);
      // Two batches at once, one created through each process; both processes' workers run chunks of both.
      const [a, b] = await Promise.all([runBatch(first.url, t, 1000), runBatch(second.url, t, 1000)]);
      const spent = (await storedUsage(first.store, { workspace_id: t.workspaceId })).reduce((x, u) => x + u.cost, 0);
      expect(spent).to.be.at.most(2 * (0.01 + perCall) + 1e-9);
      expect(a.request_counts.completed + b.request_counts.completed).to.be.at.least(9);
    } finally {
      await second.stop();
      await first.stop();
    }
  });
});

/**
 * Six concurrent chat calls of `body` from a workspace with $0.25, on `test/<name>`: $1 per million
 * tokens in and out, on a sandbox provider with `faults`. `first` runs before them.
 */
async function sixCallsOnAQuarter(
  name: string,
  faults: string,
  body: Record<string, unknown>,
  first?: (url: string, key: string) => Promise<void>,
): Promise<{ answers: Awaited<ReturnType<typeof call>>[]; spent: number }> {
  const catalog = writeTestCatalog(name, (c) => {
    c.providers.push(providerEntry(name, `\${SANDBOX_URL}/~${faults}/openai/v1`));
    c.models.push(
      modelEntry(`test/${name}`, [endpointEntry(name, 1, { supported_parameters: ['max_tokens'] })], { context_length: 200_000 }),
    );
  });
  const gw = await startTestGateway({ withWorker: false, env: { CATALOG_PATH: catalog } });
  try {
    const t = await createTenant(gw.store, 0.25);
    await first?.(gw.url, t.inferenceKey);
    const asked = { ...body, model: `test/${name}` };
    const answers = await Promise.all(
      Array.from({ length: 6 }, () => call(`${gw.url}/api/v1/chat/completions`, { key: t.inferenceKey, body: asked })),
    );
    await gw.usage.flushed();
    const spent = (await storedUsage(gw.store, { workspace_id: t.workspaceId })).reduce((x, u) => x + u.cost, 0);
    return { answers, spent };
  } finally {
    await gw.stop();
  }
}

describe('what a call asks a provider for beyond its bytes', function () {
  this.timeout(60_000);

  it("a chat call's n answers are each held for: concurrent calls asking for 100 overspend by one estimate at most (before: each held as one answer, $0.60 spent of $0.25)", async () => {
    // Every answer 1,000 words long: n=100 with max_tokens 1,000 costs ~$0.10, and so does its estimate.
    const body = { messages: [{ role: 'user', content: 'hi' }], max_tokens: 1000, n: 100 };
    const { answers, spent } = await sixCallsOnAQuarter('nchoices', 'nchoices=1,max_words=1000', body, async (url, key) => {
      const refused = await call(`${url}/api/v1/chat/completions`, { key, body: { ...body, model: 'test/nchoices', n: 129 } });
      expect(refused.status).to.equal(400);
      expect(refused.body.error.message).to.equal('n: must be <= 128');
    });
    const answered = answers.find((r) => r.status === 200)!;
    expect(answered.body.choices).to.have.length(100);
    expect(answered.body.usage.completion_tokens).to.equal(100_000);
    expect(answers.map((r) => r.status)).to.include(402);
    expect(spent).to.be.at.most(0.25 + 0.1001 + 1e-9);
  });

  it('images named by URL are held for at what a provider may count for them: concurrent calls overspend by one estimate at most (before: held by their bytes, $0.51 spent of $0.25)', async () => {
    // The sandbox counts each image as 85 tokens: 1,000 images cost $0.085 a call.
    const content = Array.from({ length: 1_000 }, (_, i) => ({ type: 'image_url', image_url: { url: `https://img.example/${i}.png` } }));
    const { answers, spent } = await sixCallsOnAQuarter('images', 'images=1', { messages: [{ role: 'user', content }], max_tokens: 5 });
    expect(answers.find((r) => r.status === 200)!.body.usage.prompt_tokens).to.be.at.least(85_000);
    expect(answers.map((r) => r.status)).to.include(402);
    // One estimate: the model's whole context (1,000 images of up to 2,500 tokens do not fit in less).
    expect(spent).to.be.at.most(0.25 + 0.2 + 1e-9);
  });

  it('images named by URL in a stream its client leaves before the provider counted the prompt are billed as the hold counts them (before: by their bytes, 198 prompt tokens for 10 images)', async () => {
    const catalog = writeTestCatalog('images-left', (c) => {
      c.providers.push(providerEntry('imagesleft', '${SANDBOX_URL}/~images=1,max_words=200,chunk_delay=20/openai/v1'));
      c.models.push(
        modelEntry('test/images-left', [endpointEntry('imagesleft', 1, { supported_parameters: ['max_tokens'] })], {
          context_length: 200_000,
        }),
      );
    });
    const gw = await startTestGateway({ withWorker: false, env: { CATALOG_PATH: catalog } });
    try {
      const t = await createTenant(gw.store, 5);
      const content = Array.from({ length: 10 }, (_, i) => ({ type: 'image_url', image_url: { url: `https://img.example/${i}.png` } }));
      const record = await streamLeftEarly(gw, t.inferenceKey, {
        model: 'test/images-left',
        messages: [{ role: 'user', content }],
        max_tokens: 200,
      });
      expect(record.input_tokens).to.be.at.least(10 * 2_500);
    } finally {
      await gw.stop();
    }
  });
});

describe('prompt tokens a provider reads from or writes to its cache', () => {
  it('are billed at the catalog’s cache prices, counted in the prompt tokens; streamed or not (before: not billed at all)', async function () {
    this.timeout(60_000);
    // An Anthropic-format provider: $1 per million prompt tokens, $2 to write to the cache, $0.10 to read from it.
    const catalog = writeTestCatalog('cache-prices', (c) => {
      c.providers.push(providerEntry('cacheprices', '${SANDBOX_URL}/~cacheprices=1/anthropic', { adapter: 'anthropic' }));
      c.models.push(
        modelEntry('test/cached', [
          endpointEntry('cacheprices', 1, {
            supported_parameters: ['max_tokens'],
            pricing: { prompt: 1, completion: 1, cache_write: 2, cache_write_1h: 3, cache_read: 0.1 } as never,
          }),
        ]),
      );
    });
    const gw = await startTestGateway({ withWorker: false, env: { CATALOG_PATH: catalog } });
    try {
      const t = await createTenant(gw.store, 5);
      const system = [{ type: 'text', text: `${'policy '.repeat(4_000)}${uniqueName('v')}`, cache_control: { type: 'ephemeral' } }];
      const ask = (stream = false) =>
        call(`${gw.url}/api/v1/messages`, {
          key: t.inferenceKey,
          body: { model: 'test/cached', system, messages: [{ role: 'user', content: 'hi' }], max_tokens: 5, stream },
        });
      const billed = async (id: string) => {
        await gw.usage.flushed();
        return (await storedUsage(gw.store, { _id: id }))[0];
      };
      const costOfUsage = (u: {
        input_tokens: number;
        cache_creation_input_tokens: number;
        cache_read_input_tokens: number;
        output_tokens: number;
      }) => (u.input_tokens + 2 * u.cache_creation_input_tokens + 0.1 * u.cache_read_input_tokens + u.output_tokens) / 1e6;

      const first = await ask();
      expect(first.status, JSON.stringify(first.body)).to.equal(200);
      const written = first.body.usage.cache_creation_input_tokens;
      expect(written).to.be.at.least(4_000);
      const one = await billed(first.body.id);
      expect(one.input_tokens).to.equal(first.body.usage.input_tokens + written);
      expect(one.cost).to.be.closeTo(costOfUsage(first.body.usage), 1e-9);
      expect(first.body.usage.cost).to.be.closeTo(one.cost, 1e-9);

      const second = await ask();
      expect(second.body.usage.cache_read_input_tokens).to.equal(written);
      expect((await billed(second.body.id)).cost).to.be.closeTo(costOfUsage(second.body.usage), 1e-9);

      // Streamed: the counts arrive in message_start, the cost with message_delta.
      const streamed = await ask(true);
      const events = sseJson(streamed.body);
      const id = events.find((e) => e.type === 'message_start').message.id;
      const usage = {
        ...events.find((e) => e.type === 'message_start').message.usage,
        ...events.find((e) => e.type === 'message_delta').usage,
      };
      expect(usage.cache_read_input_tokens).to.equal(written);
      const record = await billed(id);
      expect(record.input_tokens).to.equal(usage.input_tokens + written);
      expect(record.cost).to.be.closeTo(costOfUsage(usage), 1e-9);

      // Written to the 1-hour cache: at its own price.
      const hourly = [{ ...system[0], text: `${system[0].text} hourly`, cache_control: { type: 'ephemeral', ttl: '1h' } }];
      const hour = await call(`${gw.url}/api/v1/messages`, {
        key: t.inferenceKey,
        body: { model: 'test/cached', system: hourly, messages: [{ role: 'user', content: 'hi' }], max_tokens: 5 },
      });
      expect(hour.body.usage.cache_creation.ephemeral_1h_input_tokens).to.be.at.least(4_000);
      const u = hour.body.usage;
      expect((await billed(hour.body.id)).cost).to.be.closeTo(
        (u.input_tokens + 3 * u.cache_creation_input_tokens + u.output_tokens) / 1e6,
        1e-9,
      );

      // A chat-format stream served by this Anthropic provider: its translated usage names what was
      // written (cache_write_tokens) beside what was read, and the cost follows both.
      const chatSystem = [{ type: 'text', text: `${system[0].text} chat`, cache_control: { type: 'ephemeral' } as Record<string, string> }];
      const chatStream = async () => {
        const r = await call(`${gw.url}/api/v1/chat/completions`, {
          key: t.inferenceKey,
          body: {
            model: 'test/cached',
            messages: [
              { role: 'system', content: chatSystem },
              { role: 'user', content: 'hi' },
            ],
            max_tokens: 5,
            stream: true,
            stream_options: { include_usage: true },
          },
        });
        const chunks = sseJson(r.body);
        const last = chunks.find((c) => c.usage);
        return { id: chunks[0].id as string, usage: last.usage };
      };
      const chatCost = (u: {
        prompt_tokens: number;
        completion_tokens: number;
        prompt_tokens_details: { cached_tokens: number; cache_write_tokens?: number; cache_write_1h_tokens?: number };
      }) => {
        const read = u.prompt_tokens_details.cached_tokens;
        const write = u.prompt_tokens_details.cache_write_tokens ?? 0;
        const hour = u.prompt_tokens_details.cache_write_1h_tokens ?? 0;
        return (u.prompt_tokens - read - write + 2 * (write - hour) + 3 * hour + 0.1 * read + u.completion_tokens) / 1e6;
      };
      const wrote = await chatStream();
      expect(wrote.usage.prompt_tokens_details.cache_write_tokens).to.be.at.least(4_000);
      expect((await billed(wrote.id)).cost).to.be.closeTo(chatCost(wrote.usage), 1e-9);
      const read = await chatStream();
      expect(read.usage.prompt_tokens_details.cached_tokens).to.equal(wrote.usage.prompt_tokens_details.cache_write_tokens);
      expect((await billed(read.id)).cost).to.be.closeTo(chatCost(read.usage), 1e-9);
      // Written to the 1-hour cache through the chat format: named apart, at its own price (before: at the 5-minute price).
      chatSystem[0] = { ...chatSystem[0], text: `${chatSystem[0].text} hourly`, cache_control: { type: 'ephemeral', ttl: '1h' } };
      const chatHour = await chatStream();
      const hourWritten = chatHour.usage.prompt_tokens_details.cache_write_1h_tokens;
      expect(hourWritten).to.be.at.least(4_000).and.equal(chatHour.usage.prompt_tokens_details.cache_write_tokens);
      expect((await billed(chatHour.id)).cost).to.be.closeTo(chatCost(chatHour.usage), 1e-9);

      // GET /generation shows what each was billed for besides plain prompt and completion tokens.
      const generation = async (gid: string) =>
        (await call(`${gw.url}/api/v1/generation?id=${encodeURIComponent(gid)}`, { key: t.inferenceKey })).body.data;
      expect(await generation(first.body.id)).to.deep.include({
        tokens_prompt: first.body.usage.input_tokens + written,
        tokens_cache_read: 0,
        tokens_cache_write: written,
        tokens_cache_write_1h: 0,
        web_searches: 0,
      });
      expect(await generation(id)).to.deep.include({ tokens_cache_read: written, tokens_cache_write: 0 });
      expect(await generation(chatHour.id)).to.deep.include({ tokens_cache_write: hourWritten, tokens_cache_write_1h: hourWritten });
    } finally {
      await gw.stop();
    }
  });

  it('without cache prices in the catalog: reads at the prompt price, writes at 1.25 times it, 1-hour writes at 2 times', () => {
    const e = { entry: { pricing: { prompt: 2, completion: 4 } } };
    expect(
      costOf(e, { input_tokens: 1_000, output_tokens: 10, cache_read_tokens: 600, cache_write_tokens: 300, cache_write_1h_tokens: 100 }),
    ).to.be.closeTo((100 * 2 + 600 * 2 + 200 * 2.5 + 100 * 4 + 10 * 4) / 1e6, 1e-12);
    // Counts that do not add up are taken as parts of the prompt, never more.
    expect(costOf(e, { input_tokens: 100, output_tokens: 0, cache_read_tokens: 600 })).to.be.closeTo((100 * 2) / 1e6, 1e-12);
  });
});

describe('web searches a provider runs for a call, and audio it hears and speaks', function () {
  this.timeout(60_000);
  let gw: TestGateway;
  before(async () => {
    // $1 per million tokens and $0.01 a search, on an Anthropic-format and an OpenAI-format provider.
    const pricing = { prompt: 1, completion: 1, web_search: 0.01 } as never;
    const catalog = writeTestCatalog('web-search', (c) => {
      c.providers.push(providerEntry('searchmsg', '${SANDBOX_URL}/~searchmsg=1/anthropic', { adapter: 'anthropic' }));
      c.providers.push(providerEntry('searchresp', '${SANDBOX_URL}/~searchresp=1/openai/v1'));
      c.models.push(modelEntry('test/search-msg', [endpointEntry('searchmsg', 1, { supported_parameters: ['max_tokens'], pricing })]));
      c.models.push(modelEntry('test/search-resp', [endpointEntry('searchresp', 1, { supported_parameters: ['max_tokens'], pricing })]));
      // Chat on OpenAI's search models: one endpoint gives a search price, a cheaper one does not.
      c.providers.push(providerEntry('searchchat', '${SANDBOX_URL}/openai/v1'), providerEntry('nosearch', '${SANDBOX_URL}/openai/v1'));
      c.models.push(
        modelEntry('test/search-chat', [
          endpointEntry('searchchat', 1, { supported_parameters: ['max_tokens'], pricing }),
          endpointEntry('nosearch', 1, { supported_parameters: ['max_tokens'], pricing: { prompt: 0.5, completion: 0.5 } as never }),
        ]),
        modelEntry('test/search-unpriced', [endpointEntry('nosearch', 1, { supported_parameters: ['max_tokens'] })]),
        // Audio: one endpoint gives audio prices (OpenAI's audio models: 16 and 8 times the text ones), a cheaper one does not.
        modelEntry('test/audio', [
          endpointEntry('searchchat', 1, {
            supported_parameters: ['max_tokens'],
            pricing: { prompt: 2.5, completion: 10, audio: 40, audio_completion: 80 } as never,
          }),
          endpointEntry('nosearch', 1, { supported_parameters: ['max_tokens'], pricing: { prompt: 1, completion: 1 } as never }),
        ]),
        // Images at $0.002 each beyond their tokens.
        modelEntry('test/image', [
          endpointEntry('searchchat', 1, {
            supported_parameters: ['max_tokens'],
            pricing: { prompt: 1, completion: 1, image: 0.002 } as never,
          }),
        ]),
      );
    });
    gw = await startTestGateway({ withWorker: true, env: { CATALOG_PATH: catalog } });
  });
  after(async () => {
    await gw.stop();
  });
  const billed = async (id: string) => {
    await gw.usage.flushed();
    return (await storedUsage(gw.store, { _id: id }))[0];
  };
  const search = { type: 'web_search_20250305', name: 'web_search', max_uses: 3 };
  /** The searches a generation was billed for, as GET /generation shows them. */
  const searchesOf = async (t: { inferenceKey: string }, id: string) => {
    const g = await call(`${gw.url}/api/v1/generation?id=${encodeURIComponent(id)}`, { key: t.inferenceKey });
    expect(g.status, JSON.stringify(g.body)).to.equal(200);
    return g.body.data.web_searches;
  };
  const messagesBody = { model: 'test/search-msg', messages: [{ role: 'user', content: 'news?' }], max_tokens: 5, tools: [search] };

  it('are billed at the endpoint’s per-search price, as each format reports them, streamed or not (before: not billed)', async () => {
    const t = await createTenant(gw.store, 5);
    const tokensCost = (input: number, output: number) => (input + output) / 1e6;
    const m = await call(`${gw.url}/api/v1/messages`, { key: t.inferenceKey, body: messagesBody });
    expect(m.status, JSON.stringify(m.body)).to.equal(200);
    expect(m.body.usage.server_tool_use).to.deep.equal({ web_search_requests: 1 });
    expect((await billed(m.body.id)).cost).to.be.closeTo(tokensCost(m.body.usage.input_tokens, m.body.usage.output_tokens) + 0.01, 1e-9);
    expect(await searchesOf(t, m.body.id)).to.equal(1);

    const streamed = await call(`${gw.url}/api/v1/messages`, { key: t.inferenceKey, body: { ...messagesBody, stream: true } });
    const events = sseJson(streamed.body);
    const start = events.find((e) => e.type === 'message_start').message;
    const delta = events.find((e) => e.type === 'message_delta').usage;
    expect((await billed(start.id)).cost).to.be.closeTo(tokensCost(start.usage.input_tokens, delta.output_tokens) + 0.01, 1e-9);

    const r = await call(`${gw.url}/api/v1/responses`, {
      key: t.inferenceKey,
      body: { model: 'test/search-resp', input: 'news?', max_output_tokens: 5, tools: [{ type: 'web_search_preview' }] },
    });
    expect(r.status, JSON.stringify(r.body)).to.equal(200);
    expect(r.body.output.map((o: { type: string }) => o.type)).to.deep.equal(['web_search_call', 'message']);
    expect((await billed(r.body.id)).cost).to.be.closeTo(tokensCost(r.body.usage.input_tokens, r.body.usage.output_tokens) + 0.01, 1e-9);
  });

  it('web_search_options on a chat call goes only to an endpoint with a search price and is billed one search per call, streamed or not, and in batch lines (before: the cheaper endpoint, no search billed)', async () => {
    const t = await createTenant(gw.store, 5);
    const chatBody = { model: 'test/search-chat', messages: [{ role: 'user', content: 'news?' }], max_tokens: 5 };
    // Sorted by price: without the search filter the cheaper endpoint would serve it.
    const searching = { ...chatBody, web_search_options: { search_context_size: 'low' }, provider: { sort: 'price' } };
    const tokensCost = (u: { prompt_tokens: number; completion_tokens: number }) => (u.prompt_tokens + u.completion_tokens) / 1e6;

    const c = await call(`${gw.url}/api/v1/chat/completions`, { key: t.inferenceKey, body: searching });
    expect(c.status, JSON.stringify(c.body)).to.equal(200);
    expect(c.body.provider).to.equal('searchchat');
    expect(c.body.usage.cost).to.be.closeTo(tokensCost(c.body.usage) + 0.01, 1e-9);
    expect((await billed(c.body.id)).cost).to.be.closeTo(tokensCost(c.body.usage) + 0.01, 1e-9);
    expect(await searchesOf(t, c.body.id)).to.equal(1);

    // Streamed: the cost the client is shown and the one billed both have the search.
    const streamed = await call(`${gw.url}/api/v1/chat/completions`, {
      key: t.inferenceKey,
      body: { ...searching, stream: true, stream_options: { include_usage: true } },
    });
    const chunks = sseJson(streamed.body);
    const last = chunks.find((x) => x.usage);
    expect(last.provider).to.equal('searchchat');
    expect(last.usage.cost).to.be.closeTo(tokensCost(last.usage) + 0.01, 1e-9);
    expect((await billed(last.id)).cost).to.be.closeTo(tokensCost(last.usage) + 0.01, 1e-9);
    expect(await searchesOf(t, last.id)).to.equal(1);

    // Without it (or with null, as some clients send), the cheaper endpoint may serve, and no search is billed.
    for (const body of [chatBody, { ...chatBody, web_search_options: null }]) {
      const plain = await call(`${gw.url}/api/v1/chat/completions`, {
        key: t.inferenceKey,
        body: { ...body, provider: { sort: 'price' } },
      });
      expect(plain.status, JSON.stringify(plain.body)).to.equal(200);
      expect(plain.body.provider).to.equal('nosearch');
      expect((await billed(plain.body.id)).cost).to.be.closeTo(tokensCost(plain.body.usage) / 2, 1e-9);
      expect(await searchesOf(t, plain.body.id)).to.equal(0);
    }

    // A batch line: the same endpoint and the same bill.
    const line = await billedBatchLine(gw, t.inferenceKey, 'test/search-chat', {
      messages: chatBody.messages,
      max_tokens: 5,
      web_search_options: {},
    });
    expect(line.provider).to.equal('searchchat');
    expect(line.cost).to.be.closeTo((line.input_tokens + line.output_tokens) / 1e6 + 0.01, 1e-9);
    expect(await searchesOf(t, line._id)).to.equal(1);
  });

  it('the web plugin (or :online) runs as the provider’s own search in each format, routed, held for and billed as one, and in batch lines; other engines are a 400 (before: ignored, no search)', async () => {
    const t = await createTenant(gw.store, 5);
    const tokensCost = (input: number, output: number) => (input + output) / 1e6;
    const messages = [{ role: 'user', content: 'news?' }];
    const web = [{ id: 'web' }];
    // Chat: sorted by price, the cheaper endpoint without a search price would serve it otherwise.
    // A plugin this gateway does not run is named with the dropped parameters.
    const c = await call(`${gw.url}/api/v1/chat/completions`, {
      key: t.inferenceKey,
      body: {
        model: 'test/search-chat',
        messages,
        max_tokens: 5,
        plugins: [...web, { id: 'response-healing' }],
        provider: { sort: 'price' },
      },
    });
    expect(c.status, JSON.stringify(c.body)).to.equal(200);
    expect(c.body.provider).to.equal('searchchat');
    expect(c.headers.get('x-gateway-dropped-params')).to.equal('plugins.response-healing');
    expect((await billed(c.body.id)).cost).to.be.closeTo(
      tokensCost(c.body.usage.prompt_tokens, c.body.usage.completion_tokens) + 0.01,
      1e-9,
    );
    // Messages, by the :online suffix: the provider's search tool.
    const m = await call(`${gw.url}/api/v1/messages`, {
      key: t.inferenceKey,
      body: { model: 'test/search-msg:online', messages, max_tokens: 5 },
    });
    expect(m.status, JSON.stringify(m.body)).to.equal(200);
    expect(m.body.usage.server_tool_use).to.deep.equal({ web_search_requests: 1 });
    expect((await billed(m.body.id)).cost).to.be.closeTo(tokensCost(m.body.usage.input_tokens, m.body.usage.output_tokens) + 0.01, 1e-9);
    // Responses: the web_search tool, with its domains.
    const r = await call(`${gw.url}/api/v1/responses`, {
      key: t.inferenceKey,
      body: { model: 'test/search-resp', input: 'news?', max_output_tokens: 5, plugins: [{ id: 'web', include_domains: ['example.com'] }] },
    });
    expect(r.status, JSON.stringify(r.body)).to.equal(200);
    expect(r.body.output.map((o: { type: string }) => o.type)).to.deep.equal(['web_search_call', 'message']);
    expect(await searchesOf(t, r.body.id)).to.equal(1);
    // Turned off: no search, and the cheaper endpoint may serve.
    const off = await call(`${gw.url}/api/v1/chat/completions`, {
      key: t.inferenceKey,
      body: { model: 'test/search-chat', messages, max_tokens: 5, plugins: [{ id: 'web', enabled: false }], provider: { sort: 'price' } },
    });
    expect([off.body.provider, await searchesOf(t, off.body.id)]).to.deep.equal(['nosearch', 0]);
    // Another engine is a search service the gateway does not run.
    const exa = await call(`${gw.url}/api/v1/chat/completions`, {
      key: t.inferenceKey,
      body: { model: 'test/search-chat', messages, plugins: [{ id: 'web', engine: 'exa' }] },
    });
    expect(exa.status).to.equal(400);
    expect(exa.body.error.message).to.equal(
      'plugins[0].engine: "exa" is a search service this gateway does not run; web search runs as the provider\'s own (engine "native")',
    );
    // A batch line with the plugin.
    const line = await billedBatchLine(gw, t.inferenceKey, 'test/search-chat', { messages, max_tokens: 5, plugins: web });
    expect(line.provider).to.equal('searchchat');
    expect(await searchesOf(t, line._id)).to.equal(1);
  });

  it('a call that may search, on models no endpoint of which gives a search price, is a 400 naming the field; the provider is not called (before: searches billed $0)', async () => {
    const t = await createTenant(gw.store, 5);
    const messages = [{ role: 'user', content: 'news?' }];
    const refused = (field: string) =>
      `${field}: web searches are billed by providers per search, and no endpoint of test/search-unpriced has a web_search price in the catalog`;
    for (const [path, body, field] of [
      ['/chat/completions', { model: 'test/search-unpriced', messages, web_search_options: {} }, 'web_search_options'],
      ['/chat/completions', { model: 'test/search-unpriced', messages, web_search_options: {}, stream: true }, 'web_search_options'],
      [
        '/responses',
        { model: 'test/search-unpriced', input: 'news?', tools: [{ type: 'function', name: 'f' }, { type: 'web_search' }] },
        'tools[1]',
      ],
      ['/messages', { model: 'test/search-unpriced', messages, max_tokens: 5, tools: [search] }, 'tools[0]'],
      // The web plugin is named, not the setting it became.
      ['/chat/completions', { model: 'test/search-unpriced', messages, plugins: [{ id: 'moderation' }, { id: 'web' }] }, 'plugins[1]'],
      ['/messages', { model: 'test/search-unpriced:online', messages, max_tokens: 5 }, 'model'],
    ] as const) {
      const r = await call(`${gw.url}/api/v1${path}`, { key: t.inferenceKey, body });
      expect(r.status, `${path} ${JSON.stringify(r.body)}`).to.equal(400);
      expect(r.body.error.message).to.equal(refused(field));
    }
    await gw.usage.flushed();
    expect(await storedUsage(gw.store, { workspace_id: t.workspaceId })).to.deep.equal([]);
  });

  it('audio sent or asked for goes only to an endpoint with audio prices and is billed at them, streamed or not, and in batch lines (before: the cheaper endpoint, audio at text prices)', async () => {
    const t = await createTenant(gw.store, 5);
    const heard = [
      {
        role: 'user',
        content: [
          { type: 'text', text: 'what is said?' },
          { type: 'input_audio', input_audio: { data: 'UklGRg==', format: 'wav' } },
        ],
      },
    ];
    const text = [{ role: 'user', content: 'say it' }];
    // Sorted by price: without the audio filter the cheaper endpoint would serve them.
    const base = { model: 'test/audio', max_tokens: 5, provider: { sort: 'price' } };
    const costOf = (u: { prompt_tokens: number; completion_tokens: number }, audioIn: number, audioOut: number) =>
      ((u.prompt_tokens - audioIn) * 2.5 + audioIn * 40 + (u.completion_tokens - audioOut) * 10 + audioOut * 80) / 1e6;
    const generation = async (id: string) =>
      (await call(`${gw.url}/api/v1/generation?id=${encodeURIComponent(id)}`, { key: t.inferenceKey })).body.data;

    // Audio heard: 100 of the prompt tokens, at the audio price.
    const h = await call(`${gw.url}/api/v1/chat/completions`, { key: t.inferenceKey, body: { ...base, messages: heard } });
    expect(h.status, JSON.stringify(h.body)).to.equal(200);
    expect(h.body.provider).to.equal('searchchat');
    expect(h.body.usage.prompt_tokens_details.audio_tokens).to.equal(100);
    expect((await billed(h.body.id)).cost).to.be.closeTo(costOf(h.body.usage, 100, 0), 1e-9);
    expect(h.body.usage.cost).to.be.closeTo(costOf(h.body.usage, 100, 0), 1e-9);
    expect(await generation(h.body.id)).to.deep.include({ tokens_audio_prompt: 100, tokens_audio_completion: 0 });

    // Audio spoken: every output token, at the audio completion price.
    const spoken = { ...base, messages: text, modalities: ['text', 'audio'], audio: { voice: 'alloy', format: 'wav' } };
    const s = await call(`${gw.url}/api/v1/chat/completions`, { key: t.inferenceKey, body: spoken });
    expect(s.status, JSON.stringify(s.body)).to.equal(200);
    expect(s.body.choices[0].message.audio.transcript).to.be.a('string');
    const out = s.body.usage.completion_tokens;
    expect((await billed(s.body.id)).cost).to.be.closeTo(costOf(s.body.usage, 0, out), 1e-9);
    expect(await generation(s.body.id)).to.deep.include({ tokens_audio_completion: out });

    // Streamed: the cost the client is shown and the one billed.
    const streamed = await call(`${gw.url}/api/v1/chat/completions`, {
      key: t.inferenceKey,
      body: { ...spoken, messages: heard, stream: true, stream_options: { include_usage: true } },
    });
    const chunks = sseJson(streamed.body);
    expect(chunks.some((c) => c.choices?.[0]?.delta?.audio?.transcript)).to.equal(true);
    const last = chunks.find((c) => c.usage);
    const expected = costOf(last.usage, 100, last.usage.completion_tokens);
    expect(last.usage.cost).to.be.closeTo(expected, 1e-9);
    expect((await billed(last.id)).cost).to.be.closeTo(expected, 1e-9);

    // A batch line sending audio: the same endpoint and prices.
    const line = await billedBatchLine(gw, t.inferenceKey, 'test/audio', { messages: heard, max_tokens: 5 });
    expect(line.provider).to.equal('searchchat');
    expect(line.cost).to.be.closeTo(((line.input_tokens - 100) * 2.5 + 100 * 40 + line.output_tokens * 10) / 1e6, 1e-9);
    expect(await generation(line._id)).to.deep.include({ tokens_audio_prompt: 100 });

    // The endpoints' listing shows which endpoint has audio and search prices (USD per token, per search).
    const listed = (await call(`${gw.url}/api/v1/models/test/audio/endpoints`, { key: t.inferenceKey })).body.data.endpoints;
    const byProvider = Object.fromEntries(listed.map((e: { provider_name: string; pricing: object }) => [e.provider_name, e.pricing]));
    expect(byProvider.searchchat).to.deep.equal({
      prompt: '0.0000025',
      completion: '0.00001',
      request: '0',
      audio: '0.00004',
      audio_completion: '0.00008',
    });
    expect(byProvider.nosearch).to.deep.equal({ prompt: '0.000001', completion: '0.000001', request: '0' });
    const searchListed = (await call(`${gw.url}/api/v1/models/test/search-chat/endpoints`, { key: t.inferenceKey })).body.data.endpoints;
    expect(searchListed.find((e: { provider_name: string }) => e.provider_name === 'searchchat').pricing.web_search).to.equal('0.01');
  });

  it('images in the prompt are billed at the endpoint’s per-image price where the catalog gives one, inline or by reference, in each format, streamed or not, and in batch lines (before: not billed)', async () => {
    const t = await createTenant(gw.store, 5);
    const generation = async (id: string) =>
      (await call(`${gw.url}/api/v1/generation?id=${encodeURIComponent(id)}`, { key: t.inferenceKey })).body.data;
    const tokens = (input: number, output: number) => (input + output) / 1e6;
    const chatParts = [
      { type: 'text', text: 'what is shown?' },
      { type: 'image_url', image_url: { url: 'https://img.example/a.png' } },
      { type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgo=' } },
    ];
    const chat = await call(`${gw.url}/api/v1/chat/completions`, {
      key: t.inferenceKey,
      body: { model: 'test/image', max_tokens: 5, messages: [{ role: 'user', content: chatParts }] },
    });
    expect(chat.status, JSON.stringify(chat.body)).to.equal(200);
    const chatCost = tokens(chat.body.usage.prompt_tokens, chat.body.usage.completion_tokens) + 2 * 0.002;
    expect(chat.body.usage.cost).to.be.closeTo(chatCost, 1e-9);
    expect((await billed(chat.body.id)).cost).to.be.closeTo(chatCost, 1e-9);
    expect(await generation(chat.body.id)).to.deep.include({ images: 2 });

    // Streamed, as a Messages call to this OpenAI-format provider (translated): one image block.
    const streamed = await call(`${gw.url}/api/v1/messages`, {
      key: t.inferenceKey,
      body: {
        model: 'test/image',
        max_tokens: 5,
        stream: true,
        messages: [
          {
            role: 'user',
            content: [
              { type: 'image', source: { type: 'url', url: 'https://img.example/b.png' } },
              { type: 'text', text: 'and this?' },
            ],
          },
        ],
      },
    });
    const events = sseJson(streamed.body);
    const start = events.find((e) => e.type === 'message_start').message;
    const delta = events.find((e) => e.type === 'message_delta').usage;
    // A stream translated from a chat provider learns the prompt's count at its end: message_delta carries it.
    const streamCost = tokens(delta.input_tokens, delta.output_tokens) + 0.002;
    expect(delta.cost).to.be.closeTo(streamCost, 1e-9);
    expect((await billed(start.id)).cost).to.be.closeTo(streamCost, 1e-9);
    expect(await generation(start.id)).to.deep.include({ images: 1 });

    // A batch line with an image.
    const line = await billedBatchLine(gw, t.inferenceKey, 'test/image', {
      messages: [{ role: 'user', content: chatParts.slice(0, 2) }],
      max_tokens: 5,
    });
    expect(line.cost).to.be.closeTo(tokens(line.input_tokens, line.output_tokens) + 0.002, 1e-9);

    // Without an image price, images are their tokens only.
    const plain = await call(`${gw.url}/api/v1/chat/completions`, {
      key: t.inferenceKey,
      body: { model: 'test/search-unpriced', max_tokens: 5, messages: [{ role: 'user', content: chatParts }] },
    });
    expect((await billed(plain.body.id)).cost).to.be.closeTo(
      tokens(plain.body.usage.prompt_tokens, plain.body.usage.completion_tokens),
      1e-9,
    );
    expect(await generation(plain.body.id)).to.deep.include({ images: 2 });
  });

  it('audio sent or asked for, on models no endpoint of which gives audio prices, is a 400 naming the field', async () => {
    const t = await createTenant(gw.store, 5);
    const refused = (field: string, what: string) =>
      `${field}: audio ${what} is billed by providers at its own prices, and no endpoint of test/search-unpriced has an ${what === 'sent' ? 'audio' : 'audio_completion'} price in the catalog`;
    const model = 'test/search-unpriced';
    for (const [body, message] of [
      [
        { model, messages: [{ role: 'user', content: [{ type: 'input_audio', input_audio: { data: 'UklGRg==', format: 'wav' } }] }] },
        refused('messages[0].content[0]', 'sent'),
      ],
      [
        { model, messages: [{ role: 'user', content: 'hi' }], modalities: ['text', 'audio'], stream: true },
        refused('modalities', 'asked for'),
      ],
      [{ model, messages: [{ role: 'user', content: 'hi' }], audio: { voice: 'alloy', format: 'wav' } }, refused('audio', 'asked for')],
    ] as const) {
      const r = await call(`${gw.url}/api/v1/chat/completions`, { key: t.inferenceKey, body });
      expect(r.status, JSON.stringify(r.body)).to.equal(400);
      expect(r.body.error.message).to.equal(message);
    }
    await gw.usage.flushed();
    expect(await storedUsage(gw.store, { workspace_id: t.workspaceId })).to.deep.equal([]);
  });

  it('are held for, up to the tools’ max_uses: concurrent calls overspend by one estimate at most (before: $0.06 spent of $0.02)', async () => {
    const t = await createTenant(gw.store, 0.02);
    const rs = await Promise.all(
      Array.from({ length: 6 }, () => call(`${gw.url}/api/v1/messages`, { key: t.inferenceKey, body: messagesBody })),
    );
    expect(rs.map((r) => r.status)).to.include(200);
    expect(rs.map((r) => r.status)).to.include(402);
    await gw.usage.flushed();
    const spent = (await storedUsage(gw.store, { workspace_id: t.workspaceId })).reduce((x, u) => x + u.cost, 0);
    // One estimate: three searches and the call's tokens.
    expect(spent).to.be.at.most(0.02 + 0.03 + 0.001);
  });
});
