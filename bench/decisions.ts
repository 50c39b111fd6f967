// Decision overhead and throughput, side by side in one run on one stack: the same System One
// request sent straight to the sandbox provider ("direct"), through a gateway whose decisions run
// in-process ("inline") and through one whose decisions are Temporal workflows ("workflow"), at
// concurrency 1, 10, 50 and 200; plus, on the same server, the Temporal floor (bench/temporal-floor).
// Each row has req/s, p50/p99, errors and CPU milliseconds per request of every process.
import os from 'node:os';
import {
  benchKey,
  closedLoop,
  loadSamples,
  measuredInRounds,
  mergeSamples,
  startStack,
  summarize,
  writeResult,
  type LoadSamples,
  type MeasuredRow,
} from './harness';
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

/** Requests per row by concurrency: enough for stable percentiles, bounded for the slow mode. */
const TOTALS: Record<'direct' | 'inline' | 'workflow', Record<number, number>> = {
  direct: { 1: 2000, 10: 3000, 50: 5000, 200: 6000 },
  inline: { 1: 2000, 10: 3000, 50: 5000, 200: 6000 },
  workflow: { 1: 200, 10: 400, 50: 600, 200: 800 },
};

const BARS = {
  inline: { added_p50_ms_at_c1: 0.6, min_rps_at_c50: 400, max_p99_ms_at_c50: 100, max_p99_ms_at_c200: 500, max_ferretdb_cpu_ms_at_c50: 3 },
  workflow: { max_p99_ms_at_c50: 1500, min_rps_ratio_c50_to_c10: 0.9 },
};

/**
 * Whether the workflow mode holds its throughput from c=10 to c=50 (`workflow_no_collapse`). Temporal
 * is saturated at both, and the levels' rows, measured minutes apart, differed by the machine's
 * drift between them. Here the two take turns (c=10, c=50, c=50, c=10), so drift falls on both
 * alike, and a collapse is c=50 under 0.9 of c=10. Measured so, c=50 came out at 0.81-1.00 of c=10
 * over ten runs on 2026-12-07 (docs/performance.md): the check sits near its threshold and flips
 * with the machine. The c=50 row's p99 is still held to its bar.
 */
async function workflowHeld(target: { url: string; headers: Record<string, string> }) {
  const blocks = [10, 50, 50, 10];
  const runs: Record<number, LoadSamples | undefined> = {};
  for (const c of blocks) runs[c] = mergeSamples(runs[c], await loadSamples(target.url, body, target.headers, c, TOTALS.workflow[c] / 2));
  return { c10: summarize(runs[10]!), c50: summarize(runs[50]!) };
}

/** Rounds each level is split into for direct and inline, which take turns (harness.measuredInRounds). */
const ROUNDS = 4;

export async function benchDecisions(opts: { levels?: number[]; temporalInMemory?: boolean } = {}) {
  const levels = opts.levels ?? [1, 10, 50, 200];
  const stack = await startStack(
    {},
    {
      temporalInMemory: opts.temporalInMemory,
      gateways: { inline: { DECISIONS_EXECUTION: 'inline' }, workflow: { DECISIONS_EXECUTION: 'workflow' } },
    },
  );
  try {
    const key = await benchKey(stack);
    const auth = { authorization: `Bearer ${key}` };
    const targets = {
      direct: { url: `${stack.sandboxUrl}/systemone/v1/systemone`, headers: {} },
      inline: { url: `${stack.gatewayUrls.inline}/api/v1/systemone`, headers: auth },
      workflow: { url: `${stack.gatewayUrls.workflow}/api/v1/systemone`, headers: auth },
    };
    // Warm up every path (JIT, connection pools, workflow bundle, Temporal caches). As in the proxy
    // bench, the synchronous paths get the thousands of requests V8 takes to settle (a server in use
    // is past that); the workflow path's costs are Temporal's, and 300 warm its caches.
    for (const [name, t] of Object.entries(targets)) {
      const warm = name === 'workflow' ? { concurrency: 4, requests: 300 } : { concurrency: 8, requests: 5_000 };
      await closedLoop(t.url, body, t.headers, warm.concurrency, warm.requests);
    }

    const rows: Record<string, any>[] = [];
    let held: Awaited<ReturnType<typeof workflowHeld>> | null = null;
    for (const concurrency of levels) {
      const measure = (names: (keyof typeof targets)[], rounds: number) =>
        measuredInRounds(
          stack,
          Object.fromEntries(
            names.map((name) => [
              name,
              { ...targets[name], body, requests: TOTALS[name][concurrency] ?? 1000, ok: (text: string) => text.includes('"answers"') },
            ]),
          ),
          concurrency,
          rounds,
        );
      // Direct and inline take turns, since the c=1 bar is their difference; the workflow mode, one
      // block as before (its rounds would be a few requests per connection, all ramp-up and ramp-down).
      const row: Record<string, any> = {
        concurrency,
        ...(await measure(['direct', 'inline'], ROUNDS)),
        ...(await measure(['workflow'], 1)),
      };
      const direct = row.direct as MeasuredRow;
      for (const name of ['inline', 'workflow'] as const) {
        const r = row[name] as MeasuredRow;
        row[`${name}_added_p50_ms`] = Math.round((r.p50_ms - direct.p50_ms) * 100) / 100;
      }
      rows.push(row);
      // Right after c=50's rows, in the state they were measured in (not after c=200's backlog).
      if (concurrency === 50 && levels.includes(10)) held = await workflowHeld(targets.workflow);
    }
    // On the same server in the same state: how much of a workflow-mode decision is Temporal's own.
    const temporalFloor = await measureTemporalFloor(stack.temporalAddress, 50, 300);

    const at = (c: number) => rows.find((r) => r.concurrency === c);
    const c1 = at(1);
    const c50 = at(50);
    const c200 = at(200);
    const verdicts = {
      inline_added_p50_at_c1: c1 && c1.inline_added_p50_ms <= BARS.inline.added_p50_ms_at_c1,
      inline_rps_at_c50: c50 && c50.inline.rps >= BARS.inline.min_rps_at_c50,
      inline_p99_at_c50: c50 && c50.inline.p99_ms <= BARS.inline.max_p99_ms_at_c50,
      inline_c200_no_errors_p99: c200 && c200.inline.errors === 0 && c200.inline.p99_ms <= BARS.inline.max_p99_ms_at_c200,
      inline_ferretdb_cpu_at_c50: c50 && c50.inline.cpu_ms_per_request.ferretdb <= BARS.inline.max_ferretdb_cpu_ms_at_c50,
      workflow_no_collapse:
        c50 &&
        held &&
        held.c50.rps >= held.c10.rps * BARS.workflow.min_rps_ratio_c50_to_c10 &&
        c50.workflow.p99_ms <= BARS.workflow.max_p99_ms_at_c50 &&
        c50.workflow.errors + held.c10.errors + held.c50.errors === 0,
    };
    const result = {
      benchmark: 'decisions',
      at: new Date().toISOString(),
      machine: { cpus: os.cpus().length, node: process.version },
      bars: BARS,
      verdicts,
      rows,
      workflow_held: held && { rps_at_c10: held.c10.rps, rps_at_c50: held.c50.rps },
      temporal_floor: temporalFloor,
    };
    const file = writeResult('decisions', result);
    const cpu = (r: MeasuredRow) =>
      ['inline', 'workflow', 'temporal', 'ferretdb', 'sandbox'].map((n) => r.cpu_ms_per_request[n]).join(' / ');
    console.log(
      '\n   c | mode     | req/s   | p50 / p99 ms    | added p50 | errors | CPU ms/req: inline / workflow / temporal / ferretdb / sandbox',
    );
    for (const r of rows) {
      for (const name of ['direct', 'inline', 'workflow']) {
        const x = r[name] as MeasuredRow;
        const added = name === 'direct' ? '' : String(r[`${name}_added_p50_ms`]);
        console.log(
          `${String(r.concurrency).padStart(4)} | ${name.padEnd(8)} | ${String(x.rps).padEnd(7)} | ${`${x.p50_ms} / ${x.p99_ms}`.padEnd(15)} | ${added.padEnd(9)} | ${String(x.errors).padEnd(6)} | ${cpu(x)}`,
        );
      }
    }
    console.log(
      `Temporal floor (eager start + one no-op local activity, in-process result), c=1: p50 ${temporalFloor.p50_ms} ms, p99 ${temporalFloor.p99_ms} ms`,
    );
    if (held) console.log(`workflow mode, c=10 and c=50 taking turns: ${held.c10.rps} and ${held.c50.rps} req/s`);
    console.log(`verdicts: ${JSON.stringify(verdicts)}`);
    console.log(`results: ${file}`);
    return result;
  } finally {
    await stack.stop();
  }
}
