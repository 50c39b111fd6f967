// Costs over time under steady traffic: chat calls at c=4 for BENCH_SUSTAINED_MINUTES (5, the routing
// statistics' window), through two API processes (what `npm start` runs on two cores), with the
// req/s and the CPU per call of the gateway's processes and of FerretDB, each minute; then
// FerretDB's CPU at rest, 15-45 s after the load. The first minute is the baseline: what the stack costs before its traffic has a history.
// Found this way: every process re-read the routing statistics' whole window every two seconds, so
// after five minutes FerretDB spent 0.49 ms a call (0.18 in the first) and 750 ms a second at rest.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { benchCatalog } from './batches';
import {
  benchKey,
  closedLoop,
  cpuSeconds,
  loadSamples,
  mergeSamples,
  round2,
  startStack,
  summarize,
  writeResult,
  type LoadResult,
  type LoadSamples,
} from './harness';

const MINUTES = Number(process.env.BENCH_SUSTAINED_MINUTES ?? 5);
const CONCURRENCY = 4;
const CHAT = { model: 'bench/0ms', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 };
const BARS = {
  /** The CPU per call in the last minute (FerretDB's, the gateway's), at most this multiple of the first minute's. */
  last_minute_cpu_times_first: 1.25,
  /** The last minute's req/s, at least this share of the first minute's. */
  last_minute_rps_share_of_first: 0.9,
  /** FerretDB's CPU at rest after the load (ms a second): the embedded stack idles at a few. */
  ferretdb_ms_per_s_at_rest: 50,
};

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export async function benchSustained() {
  const tmp = fs.mkdtempSync(path.join(process.env.TMPDIR ?? '/tmp', 'bench-sustained-'));
  const stack = await startStack({ CATALOG_PATH: benchCatalog(tmp) }, { gateways: { gateway: { API_PROCESSES: '2' } } });
  const { ferretdb: ferret, gateway } = stack.processes;
  try {
    const key = await benchKey(stack);
    const url = `${stack.gatewayUrl}/api/v1/chat/completions`;
    const headers = { authorization: `Bearer ${key}` };
    // Warm-up (JIT, pools) before the first minute, so the baseline is not the cold start.
    await closedLoop(url, CHAT, headers, 8, 5_000);

    const minutes: (Pick<LoadResult, 'requests' | 'errors' | 'rps' | 'p99_ms'> & {
      minute: number;
      gateway_cpu_ms_per_call: number;
      ferretdb_cpu_ms_per_call: number;
    })[] = [];
    for (let m = 1; m <= MINUTES; m++) {
      const ends = performance.now() + 60_000;
      const cpu0 = cpuSeconds(ferret?.pid);
      const gatewayCpu0 = cpuSeconds(gateway?.pid);
      let samples: LoadSamples | undefined;
      while (performance.now() < ends) samples = mergeSamples(samples, await loadSamples(url, CHAT, headers, CONCURRENCY, 2_000));
      const { requests, errors, rps, p99_ms } = summarize(samples!);
      const row = {
        minute: m,
        requests,
        errors,
        rps: Math.round(rps),
        p99_ms,
        gateway_cpu_ms_per_call: round2(((cpuSeconds(gateway?.pid) - gatewayCpu0) * 1000) / requests),
        ferretdb_cpu_ms_per_call: round2(((cpuSeconds(ferret?.pid) - cpu0) * 1000) / requests),
      };
      minutes.push(row);
      console.log(JSON.stringify(row));
    }
    await sleep(15_000);
    const rest0 = cpuSeconds(ferret?.pid);
    await sleep(30_000);
    const atRest = Math.round(((cpuSeconds(ferret?.pid) - rest0) * 1000) / 30);
    console.log(`FerretDB at rest, 15-45 s after the load: ${atRest} ms/s`);

    const [first, last] = [minutes[0], minutes[minutes.length - 1]];
    const result = {
      benchmark: 'sustained',
      at: new Date().toISOString(),
      machine: { cpus: os.cpus().length, node: process.version },
      bars: BARS,
      concurrency: CONCURRENCY,
      minutes,
      ferretdb_ms_per_s_at_rest: atRest,
      verdicts: {
        no_errors: minutes.every((r) => r.errors === 0),
        last_minute_ferretdb_cpu: last.ferretdb_cpu_ms_per_call <= first.ferretdb_cpu_ms_per_call * BARS.last_minute_cpu_times_first,
        last_minute_gateway_cpu: last.gateway_cpu_ms_per_call <= first.gateway_cpu_ms_per_call * BARS.last_minute_cpu_times_first,
        last_minute_rps: last.rps >= first.rps * BARS.last_minute_rps_share_of_first,
        ferretdb_at_rest: atRest <= BARS.ferretdb_ms_per_s_at_rest,
      },
    };
    console.log(JSON.stringify(result.verdicts));
    console.log(`results: ${writeResult('sustained', result)}`);
    return result;
  } finally {
    await stack.stop();
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}
