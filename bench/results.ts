// Reading a large batch's results: a 10,000-line then a 100,000-line batch are run on a worker of
// their own (its peak RSS for each, and one result per line, checked), then pages of 100 results are read
// at random offsets (beside reads of the batch object, the cheapest read by _id, as the baseline
// measured in the same run), and another workspace's decisions are timed alone and while 40
// readers page through the results as fast as they are let (429s waited out).
import fs from 'node:fs';
import path from 'node:path';
import { benchCatalog, peakRssMb, runBatch } from './batches';
import { benchKey, closedLoop, percentiles, startStack, writeResult } from './harness';

const LINES = Number(process.env.BENCH_RESULT_LINES ?? 100_000);
/** The batch run first, on the same worker: its peak RSS is the baseline of the large batch's. */
const SMALL_LINES = LINES / 10;
const PAGE = 100;
const READERS = 40;

const decision = {
  model: 'jev-1.13',
  state: 'I was charged twice for my subscription this month',
  questions: { urgent: { type: 'noul', instructions: 'Does this need action today?' } },
};

async function timed(url: string, key: string): Promise<{ ms: number; status: number; lines: number }> {
  const t0 = performance.now();
  const res = await fetch(url, { headers: { authorization: `Bearer ${key}` } });
  const text = await res.text();
  return { ms: performance.now() - t0, status: res.status, lines: text.split('\n').filter(Boolean).length };
}

export async function benchResults() {
  const tmp = fs.mkdtempSync(path.join(process.env.TMPDIR ?? '/tmp', 'bench-results-'));
  // The worker in a process of its own, so its memory is the batch's, not the API's upload.
  const stack = await startStack(
    { CATALOG_PATH: benchCatalog(tmp), BATCH_MAX_REQUESTS: String(LINES), BODY_LIMIT: '50mb' },
    { separateWorker: true },
  );
  try {
    const reader = await benchKey(stack);
    const other = await benchKey(stack, 'bench-other');
    const worker = stack.processes.worker.pid;
    const small = await runBatch(stack.gatewayUrl, reader, 'bench/0ms', SMALL_LINES);
    const smallPeakRssMb = peakRssMb(worker);
    const batch = await runBatch(stack.gatewayUrl, reader, 'bench/0ms', LINES);
    // High-water marks: the large batch's includes the small one's.
    const workerPeakRssMb = peakRssMb(worker);
    const counts = {
      small: await resultCount(stack.gatewayUrl, reader, small.id),
      large: await resultCount(stack.gatewayUrl, reader, batch.id),
    };
    console.log(
      JSON.stringify({
        small: { ...small, worker_peak_rss_mb: smallPeakRssMb },
        large: { ...batch, worker_peak_rss_mb: workerPeakRssMb },
        counts,
      }),
    );
    const base = `${stack.gatewayUrl}/api/v1/batches/${batch.id}`;
    const offset = () => Math.floor(Math.random() * (LINES - PAGE)) - 1;

    const pages: number[] = [];
    const objects: number[] = [];
    for (let i = 0; i < 300; i++) {
      const page = await timed(`${base}/results?after=${offset()}&limit=${PAGE}`, reader);
      if (page.status !== 200 || page.lines !== PAGE) throw new Error(`page read: ${page.status}, ${page.lines} lines`);
      pages.push(page.ms);
      objects.push((await timed(`${base}?include_results=false`, reader)).ms);
    }

    const decisions = () => closedLoop(`${stack.gatewayUrl}/api/v1/systemone`, decision, { authorization: `Bearer ${other}` }, 1, 300);
    const alone = await decisions();
    let reading = true;
    let reads = 0;
    let refused = 0;
    const readers = Array.from({ length: READERS }, async () => {
      while (reading) {
        const r = await timed(`${base}/results?after=${offset()}&limit=${PAGE}`, reader);
        if (r.status === 429) {
          refused++;
          await new Promise((res) => setTimeout(res, 20));
        } else reads++;
      }
    });
    const contended = await decisions();
    reading = false;
    await Promise.all(readers);

    const result = {
      benchmark: 'results',
      at: new Date().toISOString(),
      lines: LINES,
      batch_seconds: Math.round(batch.seconds * 10) / 10,
      results_per_line: { [SMALL_LINES]: counts.small / SMALL_LINES, [LINES]: counts.large / LINES },
      worker_peak_rss_mb: { [SMALL_LINES]: smallPeakRssMb, [LINES]: workerPeakRssMb },
      page_lines: PAGE,
      page_read: percentiles(pages),
      baseline_batch_object_read: percentiles(objects),
      decisions_alone: alone,
      decisions_with_readers: { ...contended, readers: READERS, pages_read_meanwhile: reads, refused_429: refused },
      verdicts: {
        one_result_per_line: counts.small === SMALL_LINES && counts.large === LINES,
        worker_peak_rss_at_most_1_2x_a_tenth_the_lines: workerPeakRssMb <= 1.2 * smallPeakRssMb,
        page_p50_at_most_20ms: percentiles(pages).p50_ms <= 20,
        other_workspace_decision_p99_at_most_100ms_with_40_readers: contended.p99_ms <= 100,
      },
    };
    console.log(JSON.stringify(result, null, 2));
    console.log(`results: ${writeResult('results', result)}`);
    return result;
  } finally {
    await stack.stop();
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

/** Distinct lines with a result, counted by reading every result page by page. */
async function resultCount(url: string, key: string, id: string): Promise<number> {
  const seen = new Set<number>();
  let after = -1;
  for (;;) {
    const res = await fetch(`${url}/api/v1/batches/${id}/results?after=${after}&limit=1000`, {
      headers: { authorization: `Bearer ${key}` },
    });
    if (res.status !== 200) throw new Error(`results: ${res.status}`);
    const lines = (await res.text())
      .split('\n')
      .filter(Boolean)
      .map((l) => JSON.parse(l) as { line: number });
    if (!lines.length) return seen.size;
    for (const l of lines) seen.add(l.line);
    after = lines[lines.length - 1].line;
  }
}
