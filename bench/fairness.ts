// Workspaces taking turns on the batch workers: another workspace's batch, alone and then behind a
// backlog of one workspace's one-line batches, on a Temporal server with the gateway's settings
// (fairness on) and on one without them (first come, first served), in the same run.
import { TERMINAL_STATUSES } from '../domain/batches/schema';
import { benchKey, startStack, writeResult } from './harness';

const HOG_BATCHES = Number(process.env.BENCH_FAIRNESS_BATCHES ?? 600);
const OTHER_LINES = 2_000;

const BARS = {
  /** Behind the backlog, the other workspace's batch takes at most this share of its first-come-first-served time. */
  max_share_of_fifo_behind_backlog: 0.5,
};

const lines = (n: number) => Array.from({ length: n }, (_, i) => ({ custom_id: `l${i}`, body: { input: `item ${i}`, dimensions: 2 } }));

async function create(url: string, key: string, n: number): Promise<string> {
  const res = await fetch(`${url}/api/v1/batches`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
    body: JSON.stringify({ endpoint: '/v1/embeddings', model: 'sandbox/embed-1', requests: lines(n) }),
  });
  const body = (await res.json()) as { id: string };
  if (res.status !== 202) throw new Error(`create failed: ${res.status} ${JSON.stringify(body)}`);
  return body.id;
}

/** Seconds from the batch's create to its terminal status. */
async function timed(url: string, key: string, n: number): Promise<number> {
  const started = performance.now();
  const id = await create(url, key, n);
  for (;;) {
    await new Promise((r) => setTimeout(r, 100));
    const b = (await (
      await fetch(`${url}/api/v1/batches/${id}?include_results=false`, { headers: { authorization: `Bearer ${key}` } })
    ).json()) as {
      status: string;
    };
    if ((TERMINAL_STATUSES as readonly string[]).includes(b.status)) {
      if (b.status !== 'completed') throw new Error(`batch ${id} ended ${b.status}`);
      return Math.round((performance.now() - started) / 10) / 100;
    }
  }
}

async function measure(server: 'fifo' | 'fairness') {
  const stack = await startStack({}, server === 'fifo' ? { temporalDynamicConfig: {} } : {});
  try {
    const hog = await benchKey(stack, 'hog');
    const other = await benchKey(stack, 'other');
    const alone = await timed(stack.gatewayUrl, other, OTHER_LINES);
    const started = performance.now();
    let made = 0;
    await Promise.all(
      Array.from({ length: 10 }, async () => {
        while (made++ < HOG_BATCHES) await create(stack.gatewayUrl, hog, 1);
      }),
    );
    const backlogSeconds = Math.round((performance.now() - started) / 10) / 100;
    const behind = await timed(stack.gatewayUrl, other, OTHER_LINES);
    return {
      server,
      other_batch_lines: OTHER_LINES,
      alone_seconds: alone,
      backlog_batches: HOG_BATCHES,
      backlog_created_in_seconds: backlogSeconds,
      behind_backlog_seconds: behind,
    };
  } finally {
    await stack.stop();
  }
}

export async function benchFairness() {
  const runs = [];
  for (const server of ['fifo', 'fairness'] as const) {
    const r = await measure(server);
    console.log(JSON.stringify(r));
    runs.push(r);
  }
  const [fifo, fair] = runs;
  const verdicts = {
    max_share_of_fifo_behind_backlog: fair.behind_backlog_seconds <= fifo.behind_backlog_seconds * BARS.max_share_of_fifo_behind_backlog,
  };
  const file = writeResult('fairness', { benchmark: 'fairness', at: new Date().toISOString(), bars: BARS, runs, verdicts });
  console.log(`verdicts: ${JSON.stringify(verdicts)}\nresults: ${file}`);
}
