// `npm run bench [decisions|batches|proxy|results|growth|sustained|broadcast|accept|fairness|ferretdb …]`: runs the named benchmarks (all by default) and writes
// their results as JSON under bench/results/.
import { benchDecisions } from './decisions';
import { benchBatches } from './batches';
import { benchProxy } from './proxy';
import { benchResults } from './results';
import { benchGrowth } from './growth';
import { benchSustained } from './sustained';
import { benchBroadcast } from './broadcast';
import { benchAccept } from './accept';
import { benchFairness } from './fairness';
import { benchFerretDB } from './ferretdb';

const all: Record<string, () => Promise<unknown>> = {
  // BENCH_LEVELS=1,50 runs only those concurrency levels.
  decisions: () => benchDecisions({ levels: process.env.BENCH_LEVELS?.split(',').map(Number) }),
  batches: () => benchBatches(),
  proxy: () => benchProxy({ levels: process.env.BENCH_LEVELS?.split(',').map(Number) }),
  // BENCH_RESULT_LINES sets the batch's size (100,000 by default).
  results: () => benchResults(),
  // BENCH_GROWTH_BATCHES and BENCH_GROWTH_USAGE set what is stored before the second measurement (10,000 batches, 1,000,000 usage records).
  growth: () => benchGrowth(),
  // Steady traffic for BENCH_SUSTAINED_MINUTES (5): does a call cost more once the stack has a history of them?
  sustained: () => benchSustained(),
  // What a trace destination that is down or slow costs requests.
  broadcast: () => benchBroadcast(),
  // Connection bursts under load: one Node process against two sharing the port.
  accept: () => benchAccept(),
  // Another workspace's batch behind one workspace's backlog (BENCH_FAIRNESS_BATCHES, 600), with Temporal fairness and without.
  fairness: () => benchFairness(),
  // The embedded FerretDB's garbage collector setting against Go's default, on the usage ledger's writes.
  ferretdb: () => benchFerretDB(),
};

async function main() {
  const names = process.argv.slice(2).length ? process.argv.slice(2) : Object.keys(all);
  for (const name of names) {
    const run = all[name];
    if (!run) throw new Error(`unknown benchmark ${name}; known: ${Object.keys(all).join(', ')}`);
    console.log(`== ${name}`);
    await run();
  }
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
