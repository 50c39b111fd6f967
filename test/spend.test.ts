// Bounded spend: each billable decision holds an estimate of its cost before the provider is
// called, so concurrent calls cannot overspend a workspace by more than one estimate per process.
import { expect } from 'chai';
import { Store } from '../store';
import { UsageLedger } from '../accounts/usage-ledger';
import { WorkspaceCache, type Hold } from '../accounts/workspace-cache';
import { estimateDecisionCost } from '../decisions/estimate';
import { Catalog } from '../catalog';
import { DEFAULT_CATALOG_PATH } from '../config';
import { stack } from './fixture';
import { call, createTenant, startTestGateway, uniqueName, usageRecord } from './helpers';

const question = { q: { type: 'noul', instructions: 'Is this a complaint?' } };

describe('holds against a workspace balance', () => {
  let store: Store;
  before(async () => {
    store = await Store.connect(stack.mongoUri, uniqueName('db').replace(/-/g, '_'));
  });
  after(async () => {
    await store.close();
  });

  it('admits while something is left, counting held and settled spending, then 402', async () => {
    const t = await createTenant(store, 1);
    const cache = new WorkspaceCache(store, 60_000);
    const ledger = new UsageLedger(store);
    // A call that finishes: its record is stored, then its hold settles to the real cost.
    const bill = async (h: Hold, cost: number) => {
      await ledger.record(usageRecord(`gen-hold-${uniqueName('c')}`, t.workspaceId, t.inferenceKeyId, cost));
      h.settle(cost);
    };
    const a = await cache.hold(t.workspaceId, 0.4);
    const b = await cache.hold(t.workspaceId, 0.4);
    const c = await cache.hold(t.workspaceId, 0.4); // 0.2 was left: admitted, the one estimate of overspend
    await cache.hold(t.workspaceId, 0.4).then(
      () => expect.fail('admitted past the balance'),
      (err) => expect(err.status).to.equal(402),
    );
    a.release(); // that call billed nothing
    await bill(b, 0.1); // and that one cost less than it held
    const d = await cache.hold(t.workspaceId, 0.4); // 1 - 0.1 - 0.4 (c) = 0.5 left
    await bill(c, 0.4);
    await bill(d, 0.4);
    // 0.9 spent: 0.1 is left, enough for one more call of 0.1 and no further.
    await bill(await cache.hold(t.workspaceId, 0.1), 0.1);
    await cache.hold(t.workspaceId, 0.1).then(
      () => expect.fail('admitted with nothing left'),
      (err) => expect(err.status).to.equal(402),
    );
  });

  it('spending settled while its usage record is still on its way to the ledger is not lost by a re-read', async () => {
    const t = await createTenant(store, 2);
    let unstored = 0;
    const cache = new WorkspaceCache(store, 0, Date.now, () => unstored); // TTL 0: every read goes to the ledger
    const h = await cache.hold(t.workspaceId, 0.1);
    unstored = 0.5; // journaled, not yet in the database
    h.settle(0.5);
    expect((await cache.balance(t.workspaceId)).balance).to.equal(1.5);
    await new UsageLedger(store).record(usageRecord(`gen-late-${t.workspaceId}`, t.workspaceId, t.inferenceKeyId, 0.5));
    unstored = 0;
    expect((await cache.balance(t.workspaceId)).balance).to.equal(1.5);
  });

  it("a balance is read from the cache plus this process's own spending: one ledger sum, not one per request", async () => {
    const watched = await Store.connect(stack.mongoUri, store.db.databaseName, { monitorCommands: true });
    try {
      const sums: string[] = [];
      watched.client.on('commandStarted', (e) => {
        if (e.commandName === 'aggregate') sums.push(String(e.command.aggregate));
      });
      const t = await createTenant(watched, 2);
      const cache = new WorkspaceCache(watched, 60_000);
      expect(await cache.balance(t.workspaceId)).to.deep.equal({ total_credits: 2, total_usage: 0, balance: 2 });
      const h = await cache.hold(t.workspaceId, 0.1); // plenty left: no re-read
      await new UsageLedger(watched).record(usageRecord(`gen-own-${t.workspaceId}`, t.workspaceId, t.inferenceKeyId, 0.25));
      h.settle(0.25);
      for (let i = 0; i < 50; i++)
        expect(await cache.balance(t.workspaceId)).to.deep.equal({ total_credits: 2, total_usage: 0.25, balance: 1.75 });
      expect(sums.filter((c) => c === 'usage')).to.have.length(1);
    } finally {
      await watched.close();
    }
  });

  it("near exhaustion a hold re-reads the ledger, so another process's spending is seen at once", async () => {
    const t = await createTenant(store, 1);
    const cache = new WorkspaceCache(store, 60_000);
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
        const billed = await gw.store.usage.find({ workspace_id: t.workspaceId }).toArray();
        expect(billed).to.have.length(ok.length);
        const spent = billed.reduce((a, u) => a + u.cost, 0);
        expect(spent).to.be.at.most(5 * cost + estimate + 1e-12);
      } finally {
        await gw.stop();
      }
    });
  });
