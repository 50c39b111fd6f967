// Costs as history grows: every operation measured on an empty stack, then again, in the same run,
// once BENCH_GROWTH_BATCHES batches (10,000) were created through the API and BENCH_GROWTH_USAGE
// usage records (1,000,000) were written through the ledger's own writer (the bulk of a year of
// calls in minutes). Two API processes share the stack, so a second process's spending can be
// timed into the first's GET /credits. Verdicts are the bars of the growth issue.
import fs from 'node:fs';
import path from 'node:path';
import { benchCatalog } from './batches';
import { benchKey, closedLoop, cpuSeconds, percentiles, startStack, writeResult, type Stack } from './harness';
import { Store, workspaceRange } from '../infrastructure/store';
import { UsageLedger, type UsageRecord } from '../domain/accounts/usage-ledger';
import { createWorkspace } from '../domain/accounts/workspaces';
import { getBalance, grantCredits } from '../domain/accounts/credits';
import { usageTotals } from '../domain/accounts/usage-totals';
import { createKey } from '../domain/accounts/keys';

const STORED = Number(process.env.BENCH_GROWTH_BATCHES ?? 10_000);
const RECORDS = Number(process.env.BENCH_GROWTH_USAGE ?? 1_000_000);
const SAMPLES = 100;
/** Ledger restarts billing one workspace: each used to add a totals document its balance read sums. */
const RESTARTS = Number(process.env.BENCH_GROWTH_RESTARTS ?? 1_000);
const WARM_BATCHES = 50;
const BALANCE_CACHE_MS = 2_000;
const CHAT = { model: 'bench/0ms', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 };

function diskMb(dir: string): number {
  let bytes = 0;
  for (const f of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, f.name);
    bytes += f.isDirectory() ? diskMb(p) * 1024 * 1024 : fs.statSync(p).size;
  }
  return Math.round((bytes / 1024 / 1024) * 10) / 10;
}

const round1 = (x: number) => Math.round(x * 10) / 10;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function timedFetch(url: string, init: RequestInit = {}, expect = 200): Promise<{ ms: number; body: any }> {
  const t0 = performance.now();
  const res = await fetch(url, init);
  const text = await res.text();
  const ms = performance.now() - t0;
  if (res.status !== expect) throw new Error(`${init.method ?? 'GET'} ${url}: ${res.status} ${text.slice(0, 300)}`);
  return { ms, body: text ? JSON.parse(text) : null };
}

/** A fresh workspace with credits and an inference key, written as the admin CLI would. */
async function newTenant(store: Store, name: string, credits = 1_000) {
  const ws = await createWorkspace(store, name);
  await grantCredits(store, ws._id, credits);
  return { workspaceId: ws._id, key: (await createKey(store, ws._id, { kind: 'inference' })).key };
}

export async function benchGrowth() {
  const tmp = fs.mkdtempSync(path.join(process.env.TMPDIR ?? '/tmp', 'bench-growth-'));
  const stack = await startStack(
    { CATALOG_PATH: benchCatalog(tmp), BALANCE_CACHE_MS: String(BALANCE_CACHE_MS) },
    { gateways: { a: {}, b: {} } },
  );
  const store = await Store.connect(stack.mongoUri, 'gateway');
  try {
    const key = await benchKey(stack);
    const auth = (k: string) => ({ authorization: `Bearer ${k}`, 'content-type': 'application/json' });
    const [a, b] = [stack.gatewayUrls.a, stack.gatewayUrls.b];
    const ferret = stack.processes.ferretdb;
    const batchBody = JSON.stringify({
      endpoint: '/v1/chat/completions',
      model: 'bench/0ms',
      requests: [{ custom_id: 'a', body: CHAT }],
    });
    const create = () => timedFetch(`${a}/api/v1/batches`, { method: 'POST', headers: auth(key), body: batchBody }, 202);
    let run = 0;

    const measure = async (stored: { batches: number; usage_records: number }) => {
      run++;
      // Batches: create (with FerretDB's CPU per create), then get, list and results once they ran.
      const cpu0 = cpuSeconds(ferret?.pid);
      const creates: number[] = [];
      const ids: string[] = [];
      for (let i = 0; i < SAMPLES; i++) {
        const c = await create();
        creates.push(c.ms);
        ids.push(c.body.id);
      }
      const cpuPerCreate = ((cpuSeconds(ferret?.pid) - cpu0) * 1000) / SAMPLES;
      await settled(stack, key);
      const gets: number[] = [];
      const lists: number[] = [];
      const results: number[] = [];
      for (const id of ids) {
        gets.push((await timedFetch(`${a}/api/v1/batches/${id}?include_results=false`, { headers: auth(key) })).ms);
        lists.push((await timedFetch(`${a}/api/v1/batches?limit=10`, { headers: auth(key) })).ms);
        results.push((await timedFetch(`${a}/api/v1/batches/${id}/results`, { headers: auth(key) })).ms);
      }

      // A new workspace's first call (its balance is read from nothing cached).
      const firsts: number[] = [];
      for (let i = 0; i < 20; i++) {
        const t = await newTenant(store, `first-${run}-${i}`);
        firsts.push(
          (await timedFetch(`${a}/api/v1/chat/completions`, { method: 'POST', headers: auth(t.key), body: JSON.stringify(CHAT) })).ms,
        );
      }

      // Spending through B, seen in A's GET /credits: A reads first, then B spends, then A is polled.
      const seen: number[] = [];
      for (let i = 0; i < 3; i++) {
        const t = await newTenant(store, `fresh-${run}-${i}`);
        const usageOnA = async () => (await timedFetch(`${a}/api/v1/credits`, { headers: auth(t.key) })).body.data.total_usage as number;
        const before = await usageOnA();
        await timedFetch(`${b}/api/v1/chat/completions`, { method: 'POST', headers: auth(t.key), body: JSON.stringify(CHAT) });
        const spent = performance.now();
        while ((await usageOnA()) === before) {
          if (performance.now() - spent > 60_000) throw new Error('A never saw B spend within 60 s');
          await sleep(50);
        }
        seen.push(performance.now() - spent);
      }

      // Chat completions at c=50, with FerretDB's CPU per call.
      const cpu1 = cpuSeconds(ferret?.pid);
      const load = await closedLoop(`${a}/api/v1/chat/completions`, CHAT, { authorization: `Bearer ${key}` }, 50, 4_000);
      const cpuPerCall = ((cpuSeconds(ferret?.pid) - cpu1) * 1000) / load.requests;

      return {
        stored,
        batch_create: percentiles(creates),
        batch_get: percentiles(gets),
        batch_list_10: percentiles(lists),
        batch_results: percentiles(results),
        new_workspace_first_call: percentiles(firsts),
        credits_seen_across_processes_ms: { max: Math.round(Math.max(...seen)), cache_ms: BALANCE_CACHE_MS },
        chat_c50: { rps: load.rps, p50_ms: load.p50_ms, p99_ms: load.p99_ms, errors: load.errors },
        ferretdb_cpu_ms: { per_batch_create: round1(cpuPerCreate), per_chat_call: round1(cpuPerCall) },
        ferretdb_disk_mb: diskMb(path.join(stack.dataDir, 'ferretdb')),
      };
    };

    // Warm the processes up first (JIT, connection pools, the workflow worker), so the empty run is
    // not the cold one: chat calls, and WARM_BATCHES batches created and run to the end.
    await closedLoop(`${a}/api/v1/chat/completions`, CHAT, { authorization: `Bearer ${key}` }, 50, 4_000);
    for (let i = 0; i < WARM_BATCHES; i++) await create();
    await settled(stack, key);
    const empty = await measure({ batches: WARM_BATCHES, usage_records: 0 });
    console.log(JSON.stringify(empty));

    // Fill: batches through the API, 10 at a time; usage records through the ledger, a workspace at a time.
    const fillStart = performance.now();
    let made = WARM_BATCHES + SAMPLES;
    while (made < STORED) {
      await Promise.all(Array.from({ length: Math.min(10, STORED - made) }, () => create()));
      made = Math.min(STORED, made + 10);
      if (made % 1000 === 0) console.log(`${made} batches stored (${Math.round((performance.now() - fillStart) / 1000)} s)`);
    }
    const ledger = new UsageLedger(store);
    const perWorkspace = 1_000;
    for (let w = 0; w * perWorkspace < RECORDS; w++) {
      const ws = `history-${w}`;
      const n = Math.min(perWorkspace, RECORDS - w * perWorkspace);
      await Promise.all(Array.from({ length: n }, (_, i) => ledger.record(historyRecord(`gen-history-${w}-${i}`, ws))));
      if (((w + 1) * perWorkspace) % 100_000 === 0)
        console.log(`${(w + 1) * perWorkspace} usage records stored (${Math.round((performance.now() - fillStart) / 1000)} s)`);
    }
    await ledger.flushed();
    const fillSeconds = Math.round((performance.now() - fillStart) / 1000);
    await settled(stack, key);
    const full = await measure({ batches: made, usage_records: RECORDS });
    console.log(JSON.stringify(full));
    const restarts = await balanceAfterRestarts(store);
    console.log(JSON.stringify(restarts));

    const result = {
      benchmark: 'growth',
      at: new Date().toISOString(),
      fill_seconds: fillSeconds,
      runs: [empty, full],
      restarts,
      verdicts: {
        create_p50_at_most_1_25x_empty_and_30ms:
          full.batch_create.p50_ms <= 1.25 * empty.batch_create.p50_ms && full.batch_create.p50_ms <= 30,
        list_p50_at_most_20ms: full.batch_list_10.p50_ms <= 20,
        get_p50_at_most_10ms: full.batch_get.p50_ms <= 10,
        first_call_adds_at_most_10ms: full.new_workspace_first_call.p50_ms <= empty.new_workspace_first_call.p50_ms + 10,
        credits_seen_within_cache_plus_1s: full.credits_seen_across_processes_ms.max <= BALANCE_CACHE_MS + 1_000,
        chat_c50_rps_at_least_90pct_of_empty: full.chat_c50.rps >= 0.9 * empty.chat_c50.rps,
        balance_read_after_restarts_adds_at_most_2ms: restarts.after_restarts.p50_ms <= restarts.one_ledger.p50_ms + 2,
      },
    };
    console.log(JSON.stringify(result.verdicts));
    console.log(`results: ${writeResult('growth', result)}`);
    return result;
  } finally {
    await store.close();
    await stack.stop();
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

/** One small chat call's usage record, written straight through a ledger. */
function historyRecord(id: string, workspaceId: string): UsageRecord {
  return {
    _id: id,
    workspace_id: workspaceId,
    key_id: 'key_history',
    kind: 'completion',
    model: 'bench/0ms',
    provider: 'bench-0ms',
    input_tokens: 10,
    output_tokens: 4,
    cost: 0.000_01,
    session_id: null,
    user: null,
    trace: null,
    app: { referer: null, title: null, categories: [] },
    batch_id: null,
  };
}

/**
 * A workspace billed by RESTARTS ledgers in turn, each started, billing one record and closed as a
 * process stopping would: its balance read, against one billed by a single ledger.
 */
async function balanceAfterRestarts(store: Store) {
  const record = (ws: string, i: number) => historyRecord(`gen-restart-${ws}-${i}`, ws);
  const [restarted, steady] = ['restarted', 'steady'].map((n) => `${n}-${Date.now().toString(36)}`);
  const started = performance.now();
  for (let i = 0; i < RESTARTS; i++) {
    const ledger = new UsageLedger(store);
    await ledger.recordStored(record(restarted, i));
    await ledger.close(5_000);
  }
  const restartSeconds = round1((performance.now() - started) / 1000);
  const ledger = new UsageLedger(store);
  await Promise.all(Array.from({ length: RESTARTS }, (_, i) => ledger.recordStored(record(steady, i))));
  await ledger.close(5_000);
  const reads = async (ws: string) => {
    const ms: number[] = [];
    for (let i = 0; i < 50; i++) {
      const t0 = performance.now();
      await getBalance(store, ws);
      ms.push(performance.now() - t0);
    }
    const documents = await usageTotals(store).countDocuments({ _id: workspaceRange(ws) });
    return { ...percentiles(ms), totals_documents: documents, total_usage: (await getBalance(store, ws)).total_usage };
  };
  return { restarts: RESTARTS, restart_seconds: restartSeconds, after_restarts: await reads(restarted), one_ledger: await reads(steady) };
}

/** Waits until no batch of the workspace is still running (so what is measured is history, not backlog). */
async function settled(stack: Stack, key: string): Promise<void> {
  const running = ['validating', 'in_progress', 'finalizing', 'cancelling'].map((s) => `status=${s}`).join('&');
  const deadline = Date.now() + 30 * 60_000;
  while (Date.now() < deadline) {
    const r = await timedFetch(`${stack.gatewayUrl}/api/v1/batches?limit=1&${running}`, { headers: { authorization: `Bearer ${key}` } });
    if (!r.body.data.length) return;
    await sleep(1_000);
  }
  throw new Error('batches still running after 30 minutes');
}
