import {
  ActivityFailure,
  ActivityCancellationType,
  ApplicationFailure,
  allHandlersFinished,
  CancellationScope,
  condition,
  continueAsNew,
  defineQuery,
  defineSignal,
  isCancellation,
  patched,
  proxyActivities,
  setCurrentDetails,
  setHandler,
  sleep,
  upsertSearchAttributes,
  workflowInfo,
} from '@temporalio/workflow';
import { WorkflowIdReusePolicy } from '@temporalio/common';
import type { Activities } from '../activities';
import type { BatchDoc } from '../domain/batches/store';
import type { Creation } from '../domain/batches/service';
import type { DeliveryOutcome } from '../domain/webhooks/deliver';
import { BATCH_NOT_CREATED, searchAttributes, webhookTaskQueue } from './shared';

export interface BatchWorkflowInput {
  batchId: string;
  chunks: number;
  /** Chunk activities kept running at once. */
  window: number;
  /** When the completion window ends (unix ms); absolute, so it survives continue-as-new. */
  expiresAt: number;
  phase: 'validate' | 'process';
  nextChunk: number;
  cancelRequested: boolean;
  /** Request lines in the batch, for the details the Web UI shows. */
  lines: number;
  /** Lines finished by earlier runs of this batch (continue-as-new). */
  done?: { completed: number; failed: number };
  /** How long a chunk may go without a heartbeat before it is moved to another worker (BATCH_HEARTBEAT_TIMEOUT_MS). */
  heartbeatTimeoutMs: number;
  /** Present when the batch has a callback URL: how long to keep trying, and the first wait between attempts. */
  webhook?: { windowMs: number; firstRetryMs: number };
  /**
   * Runs started since the API starts the workflow before it stores the batch: the first activities
   * wait for the batch's document, and give the batch up if it does not come within `withinMs`.
   */
  creation?: Creation;
  /**
   * What checking the lines at creation found. A batch started with it runs no validation activity:
   * all valid, it is stored in_progress by the API; any invalid, the workflow fails it. Runs started
   * before the API checked lines have none and validate in an activity (replay).
   */
  validation?: { invalid: number; examples: string[] };
  /**
   * A run started for a stored batch whose last run is gone or was stopped (BatchRuns). That run's
   * chunk activities may still be running: each learns its run is gone only from the answer to its
   * next heartbeat (sent every second by our workers, and within the heartbeat timeout by any live
   * one). This run waits that timeout first, so no line is called twice and no paid call's result
   * is thrown away by the close.
   */
  followsLostRun?: boolean;
}

export interface BatchProgress {
  status: string;
  chunks: number;
  chunks_done: number;
  cancel_requested: boolean;
}

/**
 * How a client starts a new batch's workflow (id = batch id, never reused): its first input, and
 * what the Web UI lists for it (ids and counts only, never the caller's text).
 */
export function batchWorkflowStart(
  b: Pick<
    BatchDoc,
    '_id' | 'workspace_id' | 'key_id' | 'endpoint' | 'canonical_model' | 'total' | 'chunks' | 'expires_at' | 'status' | 'validation'
  >,
  modelId: string,
  opts: {
    taskQueue: string;
    window: number;
    heartbeatTimeoutMs: number;
    createdWithinMs: number;
    webhook: BatchWorkflowInput['webhook'] | null;
  },
) {
  const input: BatchWorkflowInput = {
    batchId: b._id,
    chunks: b.chunks,
    window: opts.window,
    heartbeatTimeoutMs: opts.heartbeatTimeoutMs,
    expiresAt: b.expires_at.getTime(),
    phase: 'validate',
    nextChunk: 0,
    cancelRequested: false,
    lines: b.total,
    creation: { workspaceId: b.workspace_id, chunks: b.chunks, withinMs: opts.createdWithinMs },
    ...(opts.webhook && { webhook: opts.webhook }),
    ...(b.validation && { validation: b.validation }),
  };
  return {
    workflowId: b._id,
    taskQueue: opts.taskQueue,
    workflowIdReusePolicy: WorkflowIdReusePolicy.REJECT_DUPLICATE,
    // Tasks of its activities inherit it: a server with fairness on dispatches each workspace's backlog in turn.
    priority: { fairnessKey: b.workspace_id },
    args: [input] as [BatchWorkflowInput],
    staticSummary: `batch · ${b.total} lines · ${b.endpoint} · ${b.canonical_model} · workspace ${b.workspace_id} · key ${b.key_id}`,
    staticDetails: [
      `**Batch** ${b._id}`,
      `- workspace: ${b.workspace_id}`,
      `- created by key: ${b.key_id}`,
      `- endpoint: ${b.endpoint}`,
      `- model: ${b.canonical_model}`,
      `- lines: ${b.total} in ${b.chunks} chunk(s)`,
      `- expires: ${b.expires_at.toISOString()}`,
    ].join('\n'),
    typedSearchAttributes: [
      { key: searchAttributes.workspace, value: b.workspace_id },
      { key: searchAttributes.model, value: modelId },
      { key: searchAttributes.batchStatus, value: b.status },
    ],
  };
}

export const cancelBatchSignal = defineSignal('cancelBatch');
export const batchProgressQuery = defineQuery<BatchProgress>('progress');

/** Chunks one run schedules before continuing as new, keeping every run's history small. */
const CHUNKS_PER_RUN = 100;
/**
 * Since this patch the status changes around the chunks (in_progress, finalizing) are written by
 * the activities next to them (validation, the close) instead of two activities of their own: two
 * fewer Temporal round trips a batch. Runs started before keep their activities (replay).
 */
const STATUS_IN_NEIGHBOURS = 'status-in-neighbour-activities';
/**
 * Since this patch a batch of one chunk (up to BATCH_CHUNK_SIZE lines, 500 by default) is run and
 * closed by one activity: a Temporal round trip fewer. Runs started before close in their own step.
 */
const ONLY_CHUNK_CLOSES = 'only-chunk-closes-its-batch';

// Chunk work heartbeats every second; the heartbeat timeout (the input's, BATCH_HEARTBEAT_TIMEOUT_MS,
// 10 s by default) moves a crashed worker's chunk to another worker within seconds while leaving
// room for a slow database write. Cancelling waits until the chunk has really stopped (not only asked it to): a chunk that
// kept running after the batch closed would call providers and write results nobody counts.
const chunks = proxyActivities<Activities>({
  startToCloseTimeout: '2 hours',
  cancellationType: ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
  retry: { initialInterval: '1 second', maximumInterval: '30 seconds', backoffCoefficient: 2 },
});
// One scheduled activity per delivery attempt (no retries inside), so every attempt is its own
// entry in the history; the waits between them are workflow timers. On a queue of their own.
const webhooks = () =>
  proxyActivities<Activities>({
    taskQueue: webhookTaskQueue(workflowInfo().taskQueue),
    startToCloseTimeout: '2 minutes',
    retry: { maximumAttempts: 1 },
  });
const WEBHOOK_MAX_WAIT_MS = 3_600_000;

const bookkeeping = proxyActivities<Activities>({
  startToCloseTimeout: '10 minutes',
  heartbeatTimeout: '30 seconds',
  retry: { initialInterval: '1 second', maximumInterval: '30 seconds', backoffCoefficient: 2 },
});

/**
 * One batch (workflow id = batch id): its lines checked (at creation) ▶ in_progress ▶ a sliding
 * window of chunk activities, raced against a cancel signal and the completion-window timer ▶
 * finalizing ▶ a terminal status. Continues as new every CHUNKS_PER_RUN chunks. A batch of one
 * chunk is run and closed by a single activity. Started before the API stores the batch: a batch
 * that is never stored (its first activity says so) ends the workflow with nothing run.
 */
export async function batchWorkflow(input: BatchWorkflowInput): Promise<string> {
  try {
    return await runBatch(input);
  } catch (err) {
    if (err instanceof ActivityFailure && err.cause instanceof ApplicationFailure && err.cause.type === BATCH_NOT_CREATED) {
      // What the Web UI shows: not a batch in progress.
      setCurrentDetails('**not created**: the batch was given up before it was stored; nothing ran');
      upsertSearchAttributes([{ key: searchAttributes.batchStatus, value: 'not_created' }]);
      await condition(allHandlersFinished);
      return 'not_created';
    }
    throw err;
  }
}

async function runBatch(input: BatchWorkflowInput): Promise<string> {
  let cancelRequested = input.cancelRequested;
  let status = input.phase === 'validate' ? 'validating' : 'in_progress';
  let chunksDone = input.nextChunk;
  setHandler(cancelBatchSignal, () => {
    cancelRequested = true;
  });
  setHandler(batchProgressQuery, () => ({ status, chunks: input.chunks, chunks_done: chunksDone, cancel_requested: cancelRequested }));
  const done = { completed: input.done?.completed ?? 0, failed: input.done?.failed ?? 0 };
  // The Web UI's "current details": how far the batch has got, kept up to date as chunks finish.
  const showProgress = () =>
    setCurrentDetails(
      `**${status}** · ${done.completed + done.failed} of ${input.lines} lines done (${done.completed} completed, ${done.failed} failed) · ${chunksDone} of ${input.chunks} chunks`,
    );
  showProgress();
  if (input.followsLostRun) {
    setCurrentDetails(`**${status}** · waiting for the work of the batch's earlier run to stop`);
    await sleep(input.heartbeatTimeoutMs);
    showProgress();
  }

  /** The status as the workflow shows it (details, search attribute); `mark` also stores it. */
  const show = (s: typeof status) => {
    status = s;
    showProgress();
    upsertSearchAttributes([{ key: searchAttributes.batchStatus, value: s }]);
  };
  const mark = async (s: 'in_progress' | 'finalizing' | 'cancelling') => {
    show(s);
    await bookkeeping.setBatchStatus(input.batchId, s);
  };
  type Terminal = 'completed' | 'failed' | 'expired' | 'cancelled';
  const close = async (s: Terminal, message: string | null = null, finalizing = false) => {
    // Replay compares activity types and order, not inputs: older runs take the extra arguments too.
    await bookkeeping.closeBatch(input.batchId, s, message, finalizing, input.creation);
    return closed(s);
  };
  /** The batch is closed in the database: show it, tell its callback URL, and end. */
  const closed = async (s: Terminal) => {
    status = s;
    showProgress();
    upsertSearchAttributes([{ key: searchAttributes.batchStatus, value: s }]);
    if (input.webhook) await notify(input.webhook);
    await condition(allHandlersFinished);
    return s;
  };

  /** Posts the terminal batch until the receiver takes it or the window closes; records how it went. */
  const notify = async ({ windowMs, firstRetryMs }: { windowMs: number; firstRetryMs: number }) => {
    const giveUpAt = Date.now() + windowMs;
    let wait = firstRetryMs;
    for (let attempt = 1; ; attempt++) {
      let outcome: DeliveryOutcome;
      try {
        outcome = await webhooks().deliverBatchWebhook.executeWithOptions({ summary: `webhook attempt ${attempt}` }, [input.batchId]);
      } catch {
        outcome = { ok: false, status: null, error: 'delivery attempt failed' };
      }
      const last = !outcome.ok && Date.now() + wait > giveUpAt;
      if (outcome.ok || last) {
        await bookkeeping.recordWebhookOutcome(input.batchId, {
          status: outcome.ok ? 'delivered' : 'failed',
          attempts: attempt,
          last_status: outcome.status,
          last_error: outcome.error,
        });
        return;
      }
      await sleep(wait);
      wait = Math.min(wait * 2, WEBHOOK_MAX_WAIT_MS);
    }
  };

  /** The work done, a cancel asked for, or the completion window over: whichever comes first. */
  const firstOf = (work: Promise<unknown>) =>
    Promise.race([
      work.then(() => 'done' as const),
      condition(() => cancelRequested).then(() => 'cancel' as const),
      sleep(Math.max(1, input.expiresAt - Date.now())).then(() => 'expire' as const),
    ]);
  /** A finished chunk's lines, counted in what the workflow shows. */
  const counted = (counts: { completed: number; failed: number }) => {
    chunksDone++;
    done.completed += counts.completed;
    done.failed += counts.failed;
    showProgress();
  };

  /**
   * A batch of one chunk: its activity runs the lines and then closes the batch, raced against a
   * cancel and the completion window as the chunks of a larger batch are. A chunk asked to stop
   * after its last line has closed the batch already: it completed.
   */
  const onlyChunk = async () => {
    const scope = new CancellationScope();
    const work = scope.run(() =>
      chunks.processOnlyChunk.executeWithOptions({ summary: 'chunk 1 of 1', heartbeatTimeout: input.heartbeatTimeoutMs }, [
        input.batchId,
        input.creation,
      ]),
    );
    const outcome = await firstOf(work);
    if (outcome !== 'done') scope.cancel();
    const counts = await work.catch((err) => {
      if (isCancellation(err)) return null;
      throw err;
    });
    if (!counts) return close(outcome === 'cancel' ? 'cancelled' : 'expired');
    counted(counts);
    return closed('completed');
  };

  if (input.phase === 'validate') {
    const checked = input.validation;
    const merged = !checked && patched(STATUS_IN_NEIGHBOURS);
    const { invalid, examples } = checked ?? (await bookkeeping.validateBatchLines(input.batchId, merged));
    if (invalid > 0) {
      return close('failed', `${invalid} request line(s) are invalid for this endpoint; nothing was sent upstream: ${examples.join('; ')}`);
    }
    if (cancelRequested) return close('cancelled');
    if (checked) {
      // Stored in_progress at creation, and so started in the search attribute.
      status = 'in_progress';
      showProgress();
    } else if (merged) show('in_progress');
    else await mark('in_progress');
  }

  if (input.chunks === 1 && patched(ONLY_CHUNK_CLOSES)) return onlyChunk();

  let next = input.nextChunk;
  const scope = new CancellationScope();
  const inFlight = new Set<Promise<void>>();
  const work = scope.run(async () => {
    let scheduled = 0;
    while (next < input.chunks && scheduled < CHUNKS_PER_RUN && !workflowInfo().continueAsNewSuggested) {
      const p: Promise<void> = chunks.processBatchChunk
        .executeWithOptions(
          {
            summary: `chunk ${next + 1} of ${input.chunks}`,
            heartbeatTimeout: input.heartbeatTimeoutMs,
            // Through the task queue, where a backlog is dispatched a workspace at a time: handed
            // straight to this worker, the next chunk could take the slot its batch's last one
            // freed ahead of other workspaces' waiting chunks.
            allowEagerDispatch: false,
          },
          [input.batchId, next, input.creation],
        )
        .then(counted)
        .finally(() => inFlight.delete(p));
      inFlight.add(p);
      next++;
      scheduled++;
      if (inFlight.size >= input.window) await Promise.race(inFlight);
    }
    await Promise.all(inFlight);
  });

  const outcome = await firstOf(work);

  if (outcome !== 'done') {
    if (outcome === 'cancel') await mark('cancelling');
    scope.cancel();
    await work.catch((err) => {
      if (!isCancellation(err)) throw err;
    });
    // `work` gives up at the first chunk that confirms; close only once every chunk has stopped
    // writing (each settles only when its activity has finished), so the close counts everything.
    await Promise.allSettled([...inFlight]);
    return close(outcome === 'cancel' ? 'cancelled' : 'expired');
  }
  if (next < input.chunks) {
    await condition(allHandlersFinished);
    // Its chunks have read the batch: the next run has no need to wait for it.
    return continueAsNew<typeof batchWorkflow>({
      ...input,
      phase: 'process',
      nextChunk: next,
      cancelRequested,
      done,
      creation: undefined,
      followsLostRun: undefined,
    });
  }
  if (patched(STATUS_IN_NEIGHBOURS)) {
    show('finalizing');
    return close('completed', null, true);
  }
  await mark('finalizing');
  return close('completed');
}
