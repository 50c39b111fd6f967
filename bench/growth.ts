// Costs as history grows (a first part of the growth bench): batch create (1 line), get and list
// p50/p99 on an empty stack, then again after BENCH_GROWTH_BATCHES batches were created through
// the API, with FerretDB's CPU per operation and its size on disk. The usage-ledger half (1,000,000
// records, a new workspace's first call, cross-process credits) is not here yet.
import fs from 'node:fs';
import path from 'node:path';
import { benchCatalog } from './batches';
import { benchKey, cpuSeconds, startStack, writeResult } from './harness';

const STORED = Number(process.env.BENCH_GROWTH_BATCHES ?? 2_000);
const SAMPLES = 100;

function percentiles(ms: number[]) {
  const s = [...ms].sort((a, b) => a - b);
  const at = (q: number) => Math.round(s[Math.min(s.length - 1, Math.ceil(q * s.length) - 1)] * 100) / 100;
  return { p50_ms: at(0.5), p99_ms: at(0.99) };
}

function diskMb(dir: string): number {
  let bytes = 0;
  for (const f of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, f.name);
    bytes += f.isDirectory() ? diskMb(p) * 1024 * 1024 : fs.statSync(p).size;
  }
  return Math.round((bytes / 1024 / 1024) * 10) / 10;
}

export async function benchGrowth() {
  const tmp = fs.mkdtempSync(path.join(process.env.TMPDIR ?? '/tmp', 'bench-growth-'));
  const stack = await startStack({ CATALOG_PATH: benchCatalog(tmp) });
  try {
    const key = await benchKey(stack);
    const headers = { authorization: `Bearer ${key}`, 'content-type': 'application/json' };
    const body = JSON.stringify({
      endpoint: '/v1/chat/completions',
      model: 'bench/0ms',
      requests: [{ custom_id: 'a', body: { messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 } }],
    });
    const ferret = stack.processes.ferretdb;
    const create = async () => {
      const t0 = performance.now();
      const res = await fetch(`${stack.gatewayUrl}/api/v1/batches`, { method: 'POST', headers, body });
      const b = (await res.json()) as { id: string };
      if (res.status !== 202) throw new Error(`create: ${res.status} ${JSON.stringify(b)}`);
      return { ms: performance.now() - t0, id: b.id };
    };
    const timed = async (url: string) => {
      const t0 = performance.now();
      const res = await fetch(url, { headers });
      await res.arrayBuffer();
      if (res.status !== 200) throw new Error(`${url}: ${res.status}`);
      return performance.now() - t0;
    };
    const measure = async (stored: number) => {
      const cpu0 = cpuSeconds(ferret?.pid);
      const creates: number[] = [];
      const ids: string[] = [];
      for (let i = 0; i < SAMPLES; i++) {
        const c = await create();
        creates.push(c.ms);
        ids.push(c.id);
      }
      const cpuPerCreate = ((cpuSeconds(ferret?.pid) - cpu0) * 1000) / SAMPLES;
      await new Promise((r) => setTimeout(r, 2000)); // the batches run to the end
      const gets: number[] = [];
      const lists: number[] = [];
      for (const id of ids) {
        gets.push(await timed(`${stack.gatewayUrl}/api/v1/batches/${id}`));
        lists.push(await timed(`${stack.gatewayUrl}/api/v1/batches?limit=10`));
      }
      return {
        stored_batches: stored,
        create: percentiles(creates),
        get: percentiles(gets),
        list_10: percentiles(lists),
        ferretdb_cpu_ms_per_create: Math.round(cpuPerCreate * 10) / 10,
        ferretdb_disk_mb: diskMb(path.join(stack.dataDir, 'ferretdb')),
      };
    };
    const empty = await measure(0);
    console.log(JSON.stringify(empty));
    // Fill, 10 at a time (as the measurement did).
    let made = SAMPLES;
    while (made < STORED) {
      await Promise.all(Array.from({ length: Math.min(10, STORED - made) }, () => create()));
      made = Math.min(STORED, made + 10);
      if (made % 500 === 0) console.log(`${made} batches stored`);
    }
    // Let the stored batches run to the end first: what is measured is the cost of history, not of the backlog.
    await new Promise((r) => setTimeout(r, Number(process.env.BENCH_GROWTH_SETTLE_MS ?? 20_000)));
    const full = await measure(made);
    console.log(JSON.stringify(full));
    const result = {
      benchmark: 'growth',
      at: new Date().toISOString(),
      runs: [empty, full],
      verdicts: {
        create_p50_at_most_1_25x_empty_and_30ms: full.create.p50_ms <= 1.25 * empty.create.p50_ms && full.create.p50_ms <= 30,
        list_p50_at_most_20ms: full.list_10.p50_ms <= 20,
        get_p50_at_most_10ms: full.get.p50_ms <= 10,
      },
    };
    console.log(`results: ${writeResult('growth', result)}`);
    return result;
  } finally {
    await stack.stop();
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}
