// Decision overhead: the same System One request sent straight to the sandbox provider and
// through the gateway (HTTP ▶ auth ▶ validation ▶ Temporal workflow ▶ local activity ▶ provider
// ▶ usage record), side by side in one run, at concurrency 1, 10 and 50; and, on the same server,
// the Temporal floor under the c=1 row (bench/temporal-floor).
import { benchKey, closedLoop, cpuSeconds, startStack, writeResult, type LoadResult } from './harness';
import { measureTemporalFloor } from './temporal-floor';

const body = {
  model: 'jev-1.13',
  state: { ticket: 'I was charged twice for my subscription this month', customer: { plan: 'pro', since: 2021 } },
  questions: {
    urgent: { type: 'noul', instructions: 'Does this need action today?' },
    topic: { type: 'choice', instructions: 'Which team?', criteria: { billing: null, bug: 'a defect', account: 'logins' } },
    severity: { type: 'score', instructions: 'How severe?', criteria: ['none', 'minor', 'major', 'critical'] },
  },
};

export async function benchDecisions(opts: { levels?: [number, number][]; temporalInMemory?: boolean } = {}) {
  const levels = opts.levels ?? [[1, 300], [10, 1000], [50, 2000]];
  const stack = await startStack({}, { temporalInMemory: opts.temporalInMemory });
  try {
    const key = await benchKey(stack);
    const auth = { authorization: `Bearer ${key}` };
    const direct = `${stack.sandboxUrl}/systemone/v1/systemone`;
    const gateway = `${stack.gatewayUrl}/api/v1/systemone`;

    // Warm up both paths (JIT, connection pools, workflow bundle, Temporal caches).
    await closedLoop(direct, body, {}, 4, 200);
    await closedLoop(gateway, body, auth, 4, 200);

    const rows = [];
    let temporalFloor: { p50_ms: number; p99_ms: number } | null = null;
    for (const [concurrency, total] of levels) {
      const directRun: LoadResult = await closedLoop(direct, body, {}, concurrency, total);
      const cpuBefore = Object.fromEntries(Object.entries(stack.processes).map(([n, p]) => [n, cpuSeconds(p.pid)]));
      const gatewayRun = await closedLoop(gateway, body, auth, concurrency, total, (_s, text) => text.includes('"answers"'));
      const cpuMsPerRequest = Object.fromEntries(Object.entries(stack.processes).map(([n, p]) => [n, Math.round(((cpuSeconds(p.pid) - cpuBefore[n]) / gatewayRun.requests) * 1e5) / 100]));
      rows.push({
        concurrency, direct: directRun, gateway: gatewayRun,
        added_p50_ms: Math.round((gatewayRun.p50_ms - directRun.p50_ms) * 100) / 100,
        added_p99_ms: Math.round((gatewayRun.p99_ms - directRun.p99_ms) * 100) / 100,
        cpu_ms_per_request: cpuMsPerRequest,
      });
      // Right after the first (sequential) row, on the same server in the same state: how much of
      // that row is Temporal's own.
      temporalFloor ??= await measureTemporalFloor(stack.temporalAddress, 50, total);
    }
    const result = {
      benchmark: 'decisions', at: new Date().toISOString(), machine: { cpus: (await import('node:os')).cpus().length, node: process.version },
      bar: { added_p50_ms_at_c1: 10 }, rows, temporal_floor: temporalFloor,
    };
    const file = writeResult('decisions', result);
    console.log('\nconcurrency | direct p50/p99 ms | gateway p50/p99 ms | added p50 ms | gateway req/s | CPU ms/req (gateway, temporal, ferretdb)');
    for (const r of rows) {
      console.log(`${String(r.concurrency).padStart(11)} | ${r.direct.p50_ms} / ${r.direct.p99_ms} | ${r.gateway.p50_ms} / ${r.gateway.p99_ms} | ${r.added_p50_ms} | ${r.gateway.rps} (errors ${r.gateway.errors}) | ${r.cpu_ms_per_request.gateway}, ${r.cpu_ms_per_request.temporal}, ${r.cpu_ms_per_request.ferretdb}`);
    }
    console.log(`Temporal floor (eager start + one no-op local activity, in-process result), c=1: p50 ${temporalFloor?.p50_ms} ms, p99 ${temporalFloor?.p99_ms} ms`);
    console.log(`results: ${file}`);
    return result;
  } finally {
    await stack.stop();
  }
}
