// Batch activities. Each is idempotent: results are keyed by line number and written once, usage
// records by generation id, and status writes set values rather than add to them; a chunk resumes
// from the lines its last heartbeat reported done.
import { Context } from '@temporalio/activity';
import { CancelledFailure } from '@temporalio/common';
import type { Config } from '../config';
import { GatewayError, RateLimitedError } from '../errors';
import { invoke, type Upstreams } from '../routing/upstreams';
import { applyPreset, presetReference } from '../presets/apply';
import { getPreset } from '../presets/store';
import type { Store } from '../store';
import type { UsageLedger, UsageRecord } from '../accounts/usage-ledger';
import {
  addToTally, batches, emptyTally, inputs, lineBody, lineGenerationId, pickTally, progress, results, saveProgress, seqId, sumProgress, writeResultsOnce,
  type BatchDoc, type BatchStatus, type ChunkTally, type ResultDoc,
} from '../batches/store';
import { lineProblem, OPERATION_OF } from '../batches/lines';

export interface BatchDeps {
  store: Store;
  upstreams: Upstreams;
  batchSettings: Config['batches'];
  usage: UsageLedger;
}

const RETRYABLE = new Set([429, 502, 503, 524, 529]);
const sleep = (ms: number, signal: AbortSignal) => new Promise<void>((resolve) => {
  const t = setTimeout(resolve, ms);
  signal.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
});

/** The usage record of one billed line (its `_id` is the line's generation id). */
function lineUsage(b: BatchDoc, r: ResultDoc): UsageRecord {
  return {
    _id: r.id, workspace_id: b.workspace_id, key_id: b.key_id, kind: 'batch_line', model: b.canonical_model, provider: r.provider,
    input_tokens: r.usage!.input_tokens, output_tokens: r.usage!.output_tokens, cost: r.usage!.cost,
    session_id: b.meta.session_id, user: b.meta.user, trace: null, app: b.meta.app, batch_id: b._id,
  };
}

/** True when every endpoint tried could not even be connected to. */
function unreachable(err: GatewayError | null): boolean {
  const attempts = err?.metadata?.attempts as { kind: string }[] | undefined;
  return !!attempts?.length && attempts.every((a) => a.kind === 'connection');
}

function errorType(status: number): string {
  return status === 429 ? 'rate_limited' : status === 524 ? 'timeout' : status === 529 ? 'overloaded' : status === 404 ? 'not_found' : status < 500 ? 'invalid_request' : 'upstream_error';
}

export function createBatchActivities({ store, upstreams, batchSettings, usage }: BatchDeps) {
  async function load(batchId: string): Promise<BatchDoc> {
    const b = await batches(store).findOne({ _id: batchId });
    if (!b) throw new Error(`batch ${batchId} not found`);
    return b;
  }

  return {
    /** Checks every line against the endpoint's request shape; nothing is sent anywhere. */
    async validateBatchLines(batchId: string): Promise<{ invalid: number; examples: string[] }> {
      const b = await load(batchId);
      const examples: string[] = [];
      let invalid = 0;
      for (let i = 0; i < b.chunks; i++) {
        const chunk = await inputs(store, batchId).findOne({ _id: seqId(i) });
        for (const line of chunk?.lines ?? []) {
          const problem = lineProblem(b.endpoint, lineBody(line));
          if (problem) {
            invalid++;
            if (examples.length < 10) examples.push(`${line.custom_id} (${problem})`);
          }
        }
        Context.current().heartbeat(i);
      }
      return { invalid, examples };
    },

    async setBatchStatus(batchId: string, status: BatchStatus): Promise<void> {
      const set: Partial<BatchDoc> = { status };
      if (status === 'in_progress') set.in_progress_at = new Date();
      await batches(store).updateOne({ _id: batchId }, { $set: set });
    },

    /** Runs one chunk's lines with bounded concurrency; returns how many it finished here. */
    async processBatchChunk(batchId: string, chunkIndex: number): Promise<{ completed: number; failed: number }> {
      const ctx = Context.current();
      const b = await load(batchId);
      const chunk = await inputs(store, batchId).findOne({ _id: seqId(chunkIndex) });
      if (!chunk) throw new Error(`batch ${batchId} has no chunk ${chunkIndex}`);
      // Resume from this chunk's progress document: it is written after every stored group of
      // results, so it is never behind the last heartbeat Temporal kept (which can be older after a
      // server restart, and made live counts go backwards when a retry started from it).
      const saved = await progress(store, batchId).findOne({ _id: seqId(chunkIndex) });
      const done = new Set<number>(saved?.done ?? []);
      const abort = new AbortController();
      ctx.cancelled.catch(() => abort.abort());
      const { model, variant } = upstreams.catalog.resolve(b.model);
      const operation = OPERATION_OF[b.endpoint];
      const ws = await store.workspaces.findOne({ _id: b.workspace_id }, { projection: { settings: 1 } });
      const presets = new Map<string, ReturnType<typeof getPreset>>();
      // This chunk's counts, carried across retries in the progress document like the done lines.
      const tally: ChunkTally = { ...emptyTally(), ...(saved ? pickTally(saved) : {}) };

      const failure = (line: (typeof chunk.lines)[number], status: number, message: string, provider: string | null = null): ResultDoc => ({
        _id: seqId(line.line), line: line.line, custom_id: line.custom_id, id: lineGenerationId(batchId, line.line), ok: false, provider, response: null,
        error: { type: errorType(status), message, code: status }, usage: null,
      });

      const runLine = async (line: (typeof chunk.lines)[number]): Promise<ResultDoc> => {
        const id = lineGenerationId(batchId, line.line);
        let body = lineBody(line);
        const ref = presetReference(body);
        if (ref) {
          // A preset that is missing (or another workspace's) fails this line alone, never the chunk.
          if (!presets.has(ref.slug)) presets.set(ref.slug, getPreset(store, b.workspace_id, ref.slug));
          try {
            body = applyPreset(body, (await presets.get(ref.slug)!).designated_version, operation === 'embeddings' ? 'embeddings' : operation);
          } catch (err) {
            if (!(err instanceof GatewayError) || err.status >= 500) {
              presets.delete(ref.slug); // a database error: the next line asks again
              throw err;
            }
            return failure(line, err.status, err.message);
          }
        }
        const { model: _model, preset: _preset, ...upstreamBody } = body;
        let unreachableSince: number | null = null;
        for (let attempt = 1; ; attempt++) {
          try {
            const r = await invoke(upstreams, {
              models: [model], variant, operation, preferences: b.provider_only ? { only: b.provider_only } : undefined,
              workspace: ws?.settings, body: upstreamBody, signal: abort.signal,
            });
            return {
              _id: seqId(line.line), line: line.line, custom_id: line.custom_id, id, ok: true, provider: r.endpoint.provider.slug,
              response: { status_code: 200, request_id: typeof r.body?.id === 'string' ? r.body.id : id, body: r.body }, error: null,
              usage: { ...r.usage, cost: r.cost },
            };
          } catch (err) {
            if (abort.signal.aborted) throw new CancelledFailure('batch line cancelled');
            const g = err instanceof GatewayError ? err : null;
            const status = g?.status ?? 500;
            // A provider that refuses connections is down, not failing this line: wait it out
            // (within the outage allowance) without spending the line's attempts.
            if (unreachable(g)) {
              unreachableSince ??= Date.now();
              if (Date.now() - unreachableSince < batchSettings.outageMs) {
                attempt--;
                await sleep(1000, abort.signal);
                continue;
              }
            }
            if (g && RETRYABLE.has(status) && attempt < batchSettings.lineAttempts) {
              const wait = err instanceof RateLimitedError ? err.retryAfterSeconds * 1000 : 500 * 2 ** (attempt - 1);
              await sleep(Math.min(wait, 30_000), abort.signal);
              continue;
            }
            return failure(line, status, g?.message ?? 'Internal error processing this line', (g?.metadata?.provider_name as string | undefined) ?? null);
          }
        }
      };

      // Results and usage records are written in batches: one unordered insert each per flush.
      // Lines count as done (in the progress document) only once flushed, so a retry redoes at most
      // the unflushed ones; the first stored result of a line wins, and its usage is what is billed.
      // A failed write (the database is down) keeps its results for the next flush rather than
      // losing paid work; only when writes keep failing does the chunk give up and let Temporal retry.
      const pending: ResultDoc[] = [];
      let failingSince: number | null = null;
      let lastError: unknown = null;
      const writeOnce = async (): Promise<void> => {
        if (!pending.length) return;
        const group = pending.splice(0);
        try {
          const stored = await writeResultsOnce(store, batchId, group);
          // Through the one ledger writer: a line already billed (a retried chunk) is not billed again.
          await Promise.all(stored.filter((r) => r.ok && r.usage).map((r) => usage.record(lineUsage(b, r))));
          for (const r of stored) {
            addToTally(tally, r);
            done.add(r.line);
          }
          await saveProgress(store, batchId, chunkIndex, tally, [...done]);
          failingSince = null;
        } catch (err) {
          // Both writes are idempotent, so writing the whole group again is safe.
          pending.unshift(...group);
          failingSince ??= Date.now();
          lastError = err;
        }
      };
      let flushing: Promise<void> = Promise.resolve();
      /** Queues a write after the one in flight; never rejects. */
      const flush = () => (flushing = flushing.then(writeOnce));
      const ticker = setInterval(() => void flush(), 250);
      // Heartbeats say "alive, and these lines are stored", on their own clock: a slow database
      // write must not look like a dead worker (the SDK throttles what reaches the server).
      const beat = () => ctx.heartbeat({ done: done.size });
      const beater = setInterval(beat, 1000);
      beat();
      const givingUp = () => failingSince !== null && Date.now() - failingSince > batchSettings.outageMs;

      const queue = chunk.lines.filter((l) => !done.has(l.line));
      const worker = async () => {
        for (let line = queue.shift(); line && !abort.signal.aborted && !givingUp(); line = queue.shift()) {
          pending.push(await runLine(line));
          // Flush in the background; wait only when the database falls far behind (backpressure).
          if (pending.length >= 100) void flush();
          while (pending.length >= 1000 && !abort.signal.aborted && !givingUp()) {
            await flush();
            if (failingSince !== null) await sleep(1000, abort.signal);
          }
        }
      };
      try {
        await Promise.all(Array.from({ length: Math.min(batchSettings.lineConcurrency, queue.length) }, worker));
      } finally {
        clearInterval(ticker);
        // Keep what finished, cancelled or not, for as long as the database may come back.
        for (await flush(); pending.length && !givingUp(); await flush()) await sleep(1000, new AbortController().signal);
        clearInterval(beater);
        beat();
      }
      if (pending.length) throw new Error(`batch chunk ${chunkIndex}: results could not be stored: ${lastError instanceof Error ? lastError.message : String(lastError)}`);
      if (abort.signal.aborted) throw new CancelledFailure('batch chunk cancelled');
      return { completed: tally.completed, failed: tally.failed };
    },

    /**
     * Closes a batch: unfinished lines of an expired or cancelled batch get error results (finished
     * ones keep theirs), usage totals and the serving provider are summed from the chunk tallies, and the
     * terminal status is set.
     */
    async closeBatch(batchId: string, status: Extract<BatchStatus, 'completed' | 'failed' | 'expired' | 'cancelled'>, errorMessage: string | null = null): Promise<void> {
      const b = await load(batchId);
      // Every chunk has stopped (the workflow waits for cancelled chunks to finish), so the chunks'
      // progress documents hold every stored result: their tallies, and which lines are done.
      const t = await sumProgress(store, batchId);
      if (status === 'expired' || status === 'cancelled') {
        const have = new Set((await progress(store, batchId).find({}, { projection: { done: 1 } }).toArray()).flatMap((d) => d.done ?? []));
        const type = status === 'expired' ? 'batch_expired' : 'batch_cancelled';
        const message = status === 'expired' ? 'The batch expired before this request was processed' : 'The batch was cancelled before this request was processed';
        for (let i = 0; i < b.chunks; i++) {
          const chunk = await inputs(store, batchId).findOne({ _id: seqId(i) });
          const missing: ResultDoc[] = (chunk?.lines ?? []).filter((l) => !have.has(l.line)).map((l) => ({
            _id: seqId(l.line), line: l.line, custom_id: l.custom_id, id: lineGenerationId(batchId, l.line),
            ok: false, provider: null, response: null, error: { type, message }, usage: null,
          }));
          // A result stored by a chunk that died before saving its progress is kept, counted and billed.
          for (const r of await writeResultsOnce(store, batchId, missing)) {
            addToTally(t, r);
            if (r.ok && r.usage) await usage.record(lineUsage(b, r));
          }
          Context.current().heartbeat(i);
        }
      }
      const finalCounts = { completed: t.completed, failed: t.failed };
      const provider = Object.entries(t.providers).sort((x, y) => y[1] - x[1])[0]?.[0] ?? null;
      await batches(store).updateOne({ _id: batchId }, {
        $set: {
          status, finalized_at: new Date(), provider, error: errorMessage ? { message: errorMessage } : null, final_counts: finalCounts,
          usage: status === 'failed' ? null : {
            prompt_tokens: t.input_tokens, completion_tokens: t.output_tokens, total_tokens: t.input_tokens + t.output_tokens,
            cost: Math.round(t.cost * 1e10) / 1e10,
          },
        },
      });
    },
  };
}
