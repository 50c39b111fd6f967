// Batches as a service: checking a batch's lines, running one chunk of them, closing the batch,
// and its completion webhook. Each step is idempotent: results are keyed by line number and written
// once, usage records by generation id, and status writes set values rather than add to them; a
// chunk resumes from the lines its progress document says are stored. The Temporal activities
// (activities/batches.ts) wrap these steps: they pass the heartbeat and the cancellation signal in
// and translate ChunkCancelled for Temporal. A chunk's parts: the LineRunner takes one line to a
// result, the ChunkWriter stores results, runLines drives them.
import type { KeptVersions } from '../presets/kept-versions';
import type { Config } from '../../infrastructure/config';
import type { Store } from '../../infrastructure/store';
import type { Metrics } from '../../infrastructure/metrics';
import { sleep } from '../../infrastructure/concurrency/sleep';
import type { Upstreams } from '../routing/upstreams';
import type { DeliveryOutcome, WebhookSender } from '../webhooks/deliver';
import { webhookSecret } from '../accounts/webhook-secret';
import type { UsageLedger } from '../accounts/usage-ledger';
import type { SpendAdmission } from '../accounts/spend-admission';
import { roundUsd } from '../catalog/usd';
import {
  abandonBatch,
  dropUnpublished,
  readNewBatch,
  readBatch,
  writeStatus,
  recordWebhookOutcome,
  batchView,
  type BatchDoc,
  type BatchStatus,
} from './store';
import { addToTally, readProgress, allProgress, tallyOf, sumProgress, saveProgress, emptyTally, type ChunkTally } from './progress';
import { readChunk, eachChunk, lineBody, type InputLine } from './inputs';
import { failedResult, writeResultsOnce, pageChunk, type ResultDoc } from './results';
import { checkLine } from './lines';
import { LineRunner } from './line-runner';
import { ChunkWriter, lineUsage } from './chunk-writer';
import type { Broadcaster } from '../traces/broadcast';

export interface BatchDeps {
  store: Store;
  upstreams: Upstreams;
  batchSettings: Config['batches'];
  /** The process's usage ledger: a line's record is stored before its chunk reports it. */
  usage: UsageLedger;
  /** Spend admission, shared with the API in the same process: batch lines hold against the balance too. */
  credits: SpendAdmission;
  /** Counts the lines this process finishes. */
  metrics?: Metrics;
  /** Sends completion webhooks; a process without it cannot deliver them. */
  webhooks?: { sender: WebhookSender; timeoutMs: number };
  /** Sends each line's generation to the trace destinations. */
  broadcast?: Broadcaster;
  /** Preset versions this process has read. */
  presetVersions?: KeptVersions;
}

/** A chunk stopped because it was cancelled (what it finished is kept). */
export class ChunkCancelled extends Error {
  constructor() {
    super('batch chunk cancelled');
    this.name = 'ChunkCancelled';
  }
}

/**
 * The batch was never created: the API gave it up, or its document did not come within the time
 * allowed (then it is given up here). Its workflow ends without running anything.
 */
export class BatchNotCreated extends Error {
  constructor(id: string) {
    super(`batch ${id} was never created: given up before its document was stored`);
    this.name = 'BatchNotCreated';
  }
}

/** What a new batch's first activities need to wait for its document (workflows/batch.ts). */
export interface Creation {
  workspaceId: string;
  chunks: number;
  withinMs: number;
}

/** A chunk's lines, by how they ended. */
type Counts = { completed: number; failed: number };

/** How a long step reports that it is alive, and how it is told to stop. */
export interface StepControl {
  heartbeat(details?: unknown): void;
  signal: AbortSignal;
}

/**
 * Runs lines `concurrency` at a time, writing results in the background (every 250 ms, at once past
 * 100 pending, waiting past 1,000), heartbeating on its own clock (a slow database write must not
 * look like a dead worker), and keeping what finished whether it completes, is cancelled or fails.
 */
async function runLines(
  heartbeat: StepControl['heartbeat'],
  lines: InputLine[],
  runner: LineRunner,
  writer: ChunkWriter,
  signal: AbortSignal,
  concurrency: number,
  chunkIndex: number,
): Promise<void> {
  const ticker = setInterval(() => void writer.flush(), 250);
  const beat = () => heartbeat({ done: writer.done.size });
  const beater = setInterval(beat, 1000);
  beat();
  const queue = [...lines];
  const worker = async () => {
    // A signal of its own for the lines this worker runs one after another, stopped with the
    // chunk's (a dependent signal, which adds no listener to it): each line's waits add and remove
    // listeners on it, and Node walks all of a signal's listeners at every add; the chunk's signal
    // had one per line in flight (docs/performance.md).
    const own = AbortSignal.any([signal]);
    for (let line = queue.shift(); line && !signal.aborted && !writer.gaveUp; line = queue.shift()) {
      const { result, stored } = await runner.run(line, own);
      writer.add(result, stored);
      if (writer.backlog >= 100) void writer.flush();
      // Backpressure: wait when the database falls far behind.
      while (writer.backlog >= 1000 && !signal.aborted && !writer.gaveUp) {
        await writer.flush();
        if (writer.failing) await sleep(1000, own);
      }
    }
  };
  try {
    await Promise.all(Array.from({ length: Math.min(concurrency, queue.length) }, worker));
  } catch (err) {
    // A line stopped by the chunk's signal: to Temporal, the chunk was cancelled.
    throw signal.aborted ? new ChunkCancelled() : err;
  } finally {
    clearInterval(ticker);
    // Keep what finished, cancelled or not, for as long as the database may come back.
    for (await writer.flush(); writer.backlog && !writer.gaveUp; await writer.flush()) await sleep(1000);
    clearInterval(beater);
    writer.forgetUnstored();
    beat();
  }
  if (writer.backlog)
    throw new Error(
      `batch chunk ${chunkIndex}: results could not be stored: ${writer.error instanceof Error ? writer.error.message : String(writer.error)}`,
    );
  if (signal.aborted) throw new ChunkCancelled();
}

/** A tally's counts, as a chunk's activity answers them. */
const countsOf = (t: ChunkTally): Counts => ({ completed: t.completed, failed: t.failed });

export function batchService({ store, upstreams, batchSettings, usage, credits, metrics, webhooks, broadcast, presetVersions }: BatchDeps) {
  async function load(batchId: string): Promise<BatchDoc> {
    const b = await readBatch(store, batchId);
    if (!b) throw new Error(`batch ${batchId} not found`);
    return b;
  }

  /**
   * A new batch's document, which the API stores after starting the workflow: read again (5 ms
   * later, then twice as long each time, up to 100 ms: a large batch takes seconds to store, and
   * longer waits would add to that) until it comes. Not there within `withinMs`, the batch is given
   * up, by the same insert of its `_id` the API's store of it makes, so exactly one of the two
   * happens; then its lines are dropped. A batch given up (here or by the API) is BatchNotCreated.
   * Without `creation` (a batch stored before its workflow started, or a later step), a plain read.
   */
  async function created(batchId: string, creation: Creation | undefined, control: StepControl): Promise<BatchDoc> {
    if (!creation) return load(batchId);
    const giveUpAt = Date.now() + creation.withinMs;
    for (let wait = 5; ; wait = Math.min(2 * wait, 100)) {
      const b = await readNewBatch(store, batchId);
      if (b === 'abandoned') throw new BatchNotCreated(batchId);
      if (b) return b;
      if (Date.now() >= giveUpAt) break;
      control.heartbeat();
      await sleep(Math.min(wait, giveUpAt - Date.now()), control.signal);
      if (control.signal.aborted) throw new ChunkCancelled();
    }
    const published = await abandonBatch(store, batchId);
    if (published) return published;
    await dropUnpublished(store, { _id: batchId, workspace_id: creation.workspaceId, chunks: creation.chunks });
    throw new BatchNotCreated(batchId);
  }

  /** Runs one chunk's lines with bounded concurrency; its tally, and the batch document it read. Throws ChunkCancelled when stopped. */
  async function runChunkOf(
    batchId: string,
    chunkIndex: number,
    control: StepControl,
    creation?: Creation,
  ): Promise<{ b: BatchDoc; tally: ChunkTally }> {
    // The reads a chunk starts with go together: until they are back its lines are not running,
    // and a batch's chunks start one after another all through it.
    // Resume from this chunk's progress document: written after every stored group of results,
    // it is never behind the last heartbeat Temporal kept (older after a server restart).
    const reads = () => Promise.all([readChunk(store, { _id: batchId }, chunkIndex), readProgress(store, { _id: batchId }, chunkIndex)]);
    const [b, first] = await Promise.all([created(batchId, creation, control), reads()]);
    // A new batch's lines are stored before its document: read when it was not there yet, read again.
    const [chunk, saved] = first[0] ? first : await reads();
    if (!chunk) throw new Error(`batch ${batchId} has no chunk ${chunkIndex}`);
    const [settings] = await Promise.all([
      // As a synchronous call reads them: from spend admission's reading, which the lines' holds need anyway.
      credits.settings(b.workspace_id),
      // An empty progress document says the chunk has started: readers stop at the first chunk without
      // one (live-counts). No chunk follows the last, so nothing needs its marker.
      saved || chunkIndex === b.chunks - 1 ? null : saveProgress(store, b, chunkIndex, emptyTally(), []),
    ]);
    const writer = new ChunkWriter({ store, usage, batch: b, chunkIndex, outageMs: batchSettings.outageMs }, saved);
    const runner = new LineRunner({
      store,
      upstreams,
      batch: b,
      workspace: settings,
      credits,
      lineAttempts: batchSettings.lineAttempts,
      outageMs: batchSettings.outageMs,
      broadcast,
      presetVersions,
    });
    const before = { ...writer.tally };
    await runLines(
      control.heartbeat,
      chunk.lines.filter((l) => !writer.done.has(l.line)),
      runner,
      writer,
      control.signal,
      batchSettings.lineConcurrency,
      chunkIndex,
    );
    // Only what this run finished: a resumed chunk's earlier lines were counted where they ran.
    metrics?.batchLines.inc({ outcome: 'completed' }, writer.tally.completed - before.completed);
    metrics?.batchLines.inc({ outcome: 'failed' }, writer.tally.failed - before.failed);
    // Every line is done: store the chunk's results as pages, what readers read.
    await pageChunk(
      store,
      b,
      chunkIndex,
      chunk.lines,
      chunk.lines.flatMap((l) => writer.storedResult(l.line) ?? []),
    );
    return { b, tally: writer.tally };
  }

  /**
   * Closes a batch: unfinished lines of an expired or cancelled batch get error results (finished
   * ones keep theirs), usage totals and the serving provider are summed from the chunk tallies, and the
   * terminal status is set.
   */
  async function close(
    b: BatchDoc,
    status: Extract<BatchStatus, 'completed' | 'failed' | 'expired' | 'cancelled'>,
    errorMessage: string | null,
    /** Mark the batch finalizing first (a completed batch's last step before its terminal status). */
    finalizing: boolean,
    heartbeat: StepControl['heartbeat'],
    /** A completed one-chunk batch's tally, held by the step that ran the chunk: not read back. */
    onlyChunk?: ChunkTally,
  ): Promise<void> {
    if (finalizing) await writeStatus(store, b, { status: 'finalizing' });
    // Every chunk has stopped (the workflow waits for cancelled chunks to finish), so the chunks'
    // progress documents hold every stored result: their tallies, and which lines are done.
    const progress = onlyChunk ? [] : await allProgress(store, b);
    const t = onlyChunk ?? tallyOf(progress);
    if (status === 'expired' || status === 'cancelled') {
      const have = new Set(progress.flatMap((d) => d.done ?? []));
      const type = status === 'expired' ? 'batch_expired' : 'batch_cancelled';
      const message =
        status === 'expired'
          ? 'The batch expired before this request was processed'
          : 'The batch was cancelled before this request was processed';
      for await (const { index: i, chunk } of eachChunk(store, b)) {
        const missing: ResultDoc[] = (chunk?.lines ?? [])
          .filter((l) => !have.has(l.line))
          .map((l) => failedResult(b._id, l, { type, message }));
        // A result stored by a chunk that died before saving its progress is kept, counted and billed.
        const closing = await writeResultsOnce(store, b, missing);
        for (const r of closing) {
          addToTally(t, r);
          if (r.ok && r.usage) await usage.recordStored(lineUsage(b, r));
        }
        // The chunk is complete now: page it, unless it paged itself when it finished (a chunk
        // cancelled between its last line and its pages has no missing lines, and no pages yet).
        if (chunk) await pageChunk(store, b, i, chunk.lines, closing);
        heartbeat(i);
      }
    }
    const finalCounts = { completed: t.completed, failed: t.failed };
    const provider = Object.entries(t.providers).sort((x, y) => y[1] - x[1])[0]?.[0] ?? null;
    await writeStatus(store, b, {
      status,
      finalized_at: new Date(),
      provider,
      error: errorMessage ? { message: errorMessage } : null,
      final_counts: finalCounts,
      usage:
        status === 'failed'
          ? null
          : {
              prompt_tokens: t.input_tokens,
              completion_tokens: t.output_tokens,
              total_tokens: t.input_tokens + t.output_tokens,
              cost: roundUsd(t.cost),
            },
    });
    metrics?.batchesFinished.inc({ status });
  }

  return {
    /** Checks every line against the endpoint's request shape (nothing is sent anywhere); with `start`, a batch whose lines are all valid is marked in_progress. */
    async validateLines(
      batchId: string,
      start: boolean,
      heartbeat: StepControl['heartbeat'],
    ): Promise<{ invalid: number; examples: string[] }> {
      const b = await load(batchId);
      let found = b.validation;
      if (!found) {
        found = { invalid: 0, examples: [] };
        for await (const { index, chunk } of eachChunk(store, b)) {
          for (const line of chunk?.lines ?? []) checkLine(b.endpoint, line.custom_id, lineBody(line), found);
          heartbeat(index);
        }
      }
      if (start && !found.invalid) await writeStatus(store, b, { status: 'in_progress', in_progress_at: new Date() });
      return { invalid: found.invalid, examples: found.examples };
    },

    /** Runs one chunk's lines; returns the chunk's counts. Throws ChunkCancelled when stopped. */
    async runChunk(batchId: string, chunkIndex: number, control: StepControl, creation?: Creation): Promise<Counts> {
      return countsOf((await runChunkOf(batchId, chunkIndex, control, creation)).tally);
    },

    /**
     * Runs the lines of a batch that is one chunk, then closes it completed, with the document read
     * once; returns the counts. Once its lines are done a cancel no longer stops it: the batch is
     * complete. It goes from in_progress to completed in one write: a finalizing status no reader
     * could see would cost a write and a list-index move.
     */
    async runOnlyChunk(batchId: string, control: StepControl, creation?: Creation): Promise<Counts> {
      const { b, tally } = await runChunkOf(batchId, 0, control, creation);
      // Every line of the chunk is stored and counted in its tally, earlier attempts' included.
      await close(b, 'completed', null, false, control.heartbeat, tally);
      return countsOf(tally);
    },

    /** Closes a batch (see `close`). */
    async closeBatch(
      batchId: string,
      status: Extract<BatchStatus, 'completed' | 'failed' | 'expired' | 'cancelled'>,
      errorMessage: string | null,
      finalizing: boolean,
      control: StepControl,
      creation?: Creation,
    ): Promise<void> {
      await close(await created(batchId, creation, control), status, errorMessage, finalizing, control.heartbeat);
    },

    /**
     * One attempt to post the terminal batch object (without inline results: a receiver fetches
     * those) to its callback URL, signed with the workspace's secret. The webhook id is the same
     * for every attempt, so a receiver can drop repeats.
     */
    async deliverWebhook(batchId: string): Promise<DeliveryOutcome> {
      if (!webhooks) throw new Error('this worker cannot send webhooks');
      const b = await load(batchId);
      if (!b.callback_url) return { ok: true, status: null, error: null };
      // Sent once the batch is closed: its counts are final.
      const body = JSON.stringify(batchView(b, b.final_counts ?? (await sumProgress(store, b))));
      const secret = await webhookSecret(store, b.workspace_id);
      return webhooks.sender.send({ url: b.callback_url, secret, id: `msg_${batchId}`, body, timeoutMs: webhooks.timeoutMs });
    },

    recordWebhookOutcome(batchId: string, outcome: NonNullable<BatchDoc['webhook']>): Promise<void> {
      return recordWebhookOutcome(store, batchId, outcome);
    },

    async setStatus(batchId: string, status: BatchStatus): Promise<void> {
      const set: Partial<BatchDoc> & { status: BatchStatus } = { status };
      if (status === 'in_progress') set.in_progress_at = new Date();
      await writeStatus(store, await load(batchId), set);
    },
  };
}
