// Batch throughput: a 10,000-line batch against the sandbox at 0 ms and at 200 ms upstream latency
// with provider concurrency 100, and one 50,000-line batch. Reports wall time (create → terminal),
// lines/s, the ratio to the ideal time (lines × latency ÷ concurrency) and the worker's peak RSS.
// First, what a batch costs beyond its lines: 1-line batches created back to back.
import fs from 'node:fs';
import path from 'node:path';
import { DEFAULT_CATALOG_PATH } from '../infrastructure/config';
import { TERMINAL_STATUSES } from '../domain/batches/schema';
import { endpointEntry, modelEntry, providerEntry } from '../domain/catalog/entries';
import { benchKey, cpuByProcess, percentiles, startStack, writeResult, type Stack } from './harness';

const CONCURRENCY = 100;

const BARS = {
  /** 10,000 lines at 200 ms: wall time at most this multiple of lines × latency ÷ concurrency. */
  ratio_to_ideal_at_200ms: 1.25,
  /** The big batch at 0 ms upstream: lines per second, as many as proxied calls. */
  big_batch_lines_per_second_at_0ms: 3_000,
  big_batch_ratio_to_ideal_at_200ms: 1.1,
};

export function benchCatalog(dir: string): string {
  const base = JSON.parse(fs.readFileSync(DEFAULT_CATALOG_PATH, 'utf8'));
  const provider = (slug: string, faults: string) =>
    providerEntry(slug, `\${SANDBOX_URL}${faults ? `/~${faults}` : ''}/openai/v1`, { max_concurrency: CONCURRENCY, timeout_ms: 30_000 });
  base.providers.push(provider('bench-0ms', ''), provider('bench-200ms', 'latency=200'));
  for (const [id, p] of [
    ['bench/0ms', 'bench-0ms'],
    ['bench/200ms', 'bench-200ms'],
  ]) {
    base.models.push(modelEntry(id, [endpointEntry(p, 0.1, { upstream_model: 'sandbox-chat' })], { context_length: 1000 }));
  }
  const file = path.join(dir, 'bench-catalog.json');
  fs.writeFileSync(file, JSON.stringify(base));
  return file;
}

export function peakRssMb(pid: number | undefined): number {
  const m = /VmHWM:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Math.round(Number(m[1]) / 1024) : NaN;
}

/** Creates a batch of `lines` chat lines; its id. */
export async function postBatch(url: string, key: string, model: string, lines: number): Promise<string> {
  const requests = Array.from({ length: lines }, (_, i) => ({
    custom_id: `line-${i}`,
    body: { messages: [{ role: 'user', content: `Summarise item ${i} in five words.` }], max_tokens: 8 },
  }));
  const res = await fetch(`${url}/api/v1/batches`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
    body: JSON.stringify({ endpoint: '/v1/chat/completions', model, requests }),
  });
  const created = (await res.json()) as { id: string };
  if (res.status !== 202) throw new Error(`create failed: ${res.status} ${JSON.stringify(created)}`);
  return created.id;
}

export async function runBatch(url: string, key: string, model: string, lines: number) {
  const started = performance.now();
  const id = await postBatch(url, key, model, lines);
  const accepted = (performance.now() - started) / 1000;
  for (;;) {
    await new Promise((r) => setTimeout(r, 500));
    // /results would stream every line; the batch list item carries the counts without results.
    const list = (await (await fetch(`${url}/api/v1/batches?limit=1`, { headers: { authorization: `Bearer ${key}` } })).json()) as {
      data: { id: string; status: string; request_counts: { completed: number; failed: number } }[];
    };
    const b = list.data.find((x) => x.id === id)!;
    if (['completed', 'failed', 'expired', 'cancelled'].includes(b.status)) {
      return {
        id,
        status: b.status,
        seconds: (performance.now() - started) / 1000,
        accepted_seconds: accepted,
        counts: b.request_counts,
      };
    }
  }
}

interface BatchRun {
  lines: number;
  upstream_latency_ms: number;
  provider_concurrency: number;
  status: string;
  counts: { completed: number; failed: number };
  wall_seconds: number;
  create_seconds: number;
  lines_per_second: number;
  ideal_seconds: number;
  ratio_to_ideal: number | null;
  worker_peak_rss_mb: number;
  cores_used: Record<string, number>;
}

/**
 * 1-line batches created one after another, each running while the next is created (as a client
 * submitting small jobs does): the create's latency, and the CPU each process spends per batch
 * until all are done, what a batch costs beyond its one line (its workflow, its documents).
 */
async function smallBatches(stack: Stack, key: string, count: number) {
  const headers = { 'content-type': 'application/json', authorization: `Bearer ${key}` };
  const body = JSON.stringify({
    endpoint: '/v1/chat/completions',
    model: 'bench/0ms',
    requests: [{ custom_id: 'only', body: { messages: [{ role: 'user', content: 'Summarise this in five words.' }], max_tokens: 8 } }],
  });
  const cpuBefore = cpuByProcess(stack.processes);
  const started = performance.now();
  const creates: number[] = [];
  const pending = new Set<string>();
  for (let i = 0; i < count; i++) {
    const t = performance.now();
    const res = await fetch(`${stack.gatewayUrl}/api/v1/batches`, { method: 'POST', headers, body });
    const created = (await res.json()) as { id: string };
    if (res.status !== 202) throw new Error(`create failed: ${res.status} ${JSON.stringify(created)}`);
    creates.push(performance.now() - t);
    pending.add(created.id);
  }
  const statuses: Record<string, number> = {};
  while (pending.size) {
    await new Promise((r) => setTimeout(r, 100));
    for (const id of pending) {
      const b = (await (await fetch(`${stack.gatewayUrl}/api/v1/batches/${id}?include_results=false`, { headers })).json()) as {
        status: string;
      };
      if (!(TERMINAL_STATUSES as readonly string[]).includes(b.status)) break; // they finish about in order
      statuses[b.status] = (statuses[b.status] ?? 0) + 1;
      pending.delete(id);
    }
  }
  const seconds = (performance.now() - started) / 1000;
  const cpuAfter = cpuByProcess(stack.processes);
  const { p50_ms, p99_ms } = percentiles(creates);
  return {
    batches: count,
    statuses,
    create_p50_ms: p50_ms,
    create_p99_ms: p99_ms,
    seconds_until_all_done: Math.round(seconds * 100) / 100,
    cpu_ms_per_batch: Object.fromEntries(
      Object.entries(cpuAfter).map(([name, s]) => [name, Math.round(((s - cpuBefore[name]) * 1000 * 10) / count) / 10]),
    ),
  };
}

export async function benchBatches(
  opts: { lines?: number; big?: number; small?: number; env?: Record<string, string>; latencies?: number[] } = {},
) {
  const lines = opts.lines ?? 10_000;
  const big = opts.big ?? 50_000;
  const tmp = fs.mkdtempSync(path.join(process.env.TMPDIR ?? '/tmp', 'bench-batches-'));
  const stack = await startStack({
    CATALOG_PATH: benchCatalog(tmp),
    BATCH_MAX_REQUESTS: String(Math.max(big, 50_000)),
    BODY_LIMIT: '50mb',
    ...opts.env,
  });
  try {
    const key = await benchKey(stack);
    const smallCount = opts.small ?? 100;
    // The create and the batch's first run load and optimise code a running server already has (a
    // probe: 59 ms of the gateway's CPU a batch in the first hundred after start, 33 in the next two
    // hundreds): fifty unmeasured ones first, as the other benches warm their paths.
    if (smallCount > 0) await smallBatches(stack, key, 50);
    const small = smallCount > 0 ? await smallBatches(stack, key, smallCount) : null;
    if (small) console.log(JSON.stringify({ small_batches: small }));
    const runs: BatchRun[] = [];
    const latencies = opts.latencies ?? [0, 200];
    for (const [model, latencyMs, n] of [
      ['bench/0ms', 0, lines],
      ['bench/200ms', 200, lines],
      ['bench/0ms', 0, big],
      ['bench/200ms', 200, big],
    ] as const) {
      if (n <= 0 || !latencies.includes(latencyMs)) continue;
      const cpuBefore = cpuByProcess(stack.processes);
      const r = await runBatch(stack.gatewayUrl, key, model, n);
      // Share of one core each process used over the batch's wall time.
      const cores = Object.fromEntries(
        Object.entries(cpuByProcess(stack.processes)).map(([name, s]) => [
          name,
          Math.round(((s - cpuBefore[name]) / r.seconds) * 100) / 100,
        ]),
      );
      const ideal = (n * latencyMs) / 1000 / CONCURRENCY;
      runs.push({
        lines: n,
        upstream_latency_ms: latencyMs,
        provider_concurrency: CONCURRENCY,
        status: r.status,
        counts: r.counts,
        wall_seconds: Math.round(r.seconds * 100) / 100,
        create_seconds: Math.round(r.accepted_seconds * 100) / 100,
        lines_per_second: Math.round((n / r.seconds) * 10) / 10,
        ideal_seconds: ideal,
        ratio_to_ideal: ideal > 0 ? Math.round((r.seconds / ideal) * 100) / 100 : null,
        worker_peak_rss_mb: peakRssMb(stack.processes.gateway.pid),
        cores_used: cores,
      });
      console.log(JSON.stringify(runs[runs.length - 1]));
    }
    const run = (n: number, latencyMs: number) => runs.find((r) => r.lines === n && r.upstream_latency_ms === latencyMs);
    const done = (r: (typeof runs)[number] | undefined) => r?.status === 'completed' && r.counts.failed === 0;
    const small200 = run(lines, 200);
    const big0 = run(big, 0);
    const big200 = run(big, 200);
    const verdicts = {
      ratio_to_ideal_at_200ms: done(small200) && small200!.ratio_to_ideal! <= BARS.ratio_to_ideal_at_200ms,
      big_batch_lines_per_second_at_0ms: done(big0) && big0!.lines_per_second >= BARS.big_batch_lines_per_second_at_0ms,
      big_batch_ratio_to_ideal_at_200ms: done(big200) && big200!.ratio_to_ideal! <= BARS.big_batch_ratio_to_ideal_at_200ms,
    };
    const result = {
      benchmark: 'batches',
      at: new Date().toISOString(),
      bars: { ...BARS, big_batch_lines: big },
      verdicts,
      small_batches: small,
      runs,
    };
    console.log(`verdicts: ${JSON.stringify(verdicts)}`);
    console.log(`results: ${writeResult('batches', result)}`);
    return result;
  } finally {
    await stack.stop();
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}
