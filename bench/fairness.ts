// Workspaces taking turns on the batch workers: another workspace's batch, alone and then behind a
// backlog of one workspace's one-line batches, on a Temporal server with the gateway's settings
// (fairness on) and on one without them (first come, first served), in the same run.
import { postBatch, runBatch } from './batches';
import { benchKey, startStack, writeResult } from './harness';

const HOG_BATCHES = Number(process.env.BENCH_FAIRNESS_BATCHES ?? 600);
const OTHER_LINES = 2_000;
const MODEL = 'sandbox/chat-1';

const BARS = {
  /** Behind the backlog, the other workspace's batch takes at most this share of its first-come-first-served time. */
  max_share_of_fifo_behind_backlog: 0.5,
};

async function measure(server: 'fifo' | 'fairness') {
  const stack = await startStack({}, server === 'fifo' ? { temporalDynamicConfig: {} } : {});
  try {
    const hog = await benchKey(stack, 'hog');
    const other = await benchKey(stack, 'other');
    const timed = async () => {
      const r = await runBatch(stack.gatewayUrl, other, MODEL, OTHER_LINES);
      if (r.status !== 'completed') throw new Error(`batch ${r.id} ended ${r.status}`);
      return Math.round(r.seconds * 100) / 100;
    };
    const alone = await timed();
    const started = performance.now();
    let made = 0;
    await Promise.all(
      Array.from({ length: 10 }, async () => {
        while (made++ < HOG_BATCHES) await postBatch(stack.gatewayUrl, hog, MODEL, 1);
      }),
    );
    const backlogSeconds = Math.round((performance.now() - started) / 10) / 100;
    const behind = await timed();
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
