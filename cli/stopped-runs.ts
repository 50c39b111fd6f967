// Batches whose run an operator stopped in Temporal (terminated or cancelled in the Web UI or CLI).
// Such a run ends without closing its batch, which would stay open for good: no run is left to
// expire or close it, and nothing tells its client. Each worker process looks, every minute, at the
// batch runs Temporal closed that way since its last look, and closes each such batch cancelled
// (BatchRuns.recover): its finished lines keep their results, and its webhook is posted. A batch
// already closed, whose run was stopped while it retried the webhook, has that delivery recorded
// as given up.
//
// A look is two visibility queries, each read from Temporal's index by status and close time: it
// reads the runs stopped that way since the last look, however many batches have run. Several
// workers looking at once do no harm: a batch gets one new run.
import { setTimeout as sleep } from 'node:timers/promises';
import type { Client } from '@temporalio/client';
import type { Store } from '../infrastructure/store';
import type { Logger } from '../infrastructure/log';
import type { BatchRuns } from '../api/batch-runs';
import { readBatch, recordWebhookOutcome, type BatchDoc } from '../domain/batches/store';
import { OPEN_STATUSES } from '../domain/batches/schema';
import type { Activities } from '../activities';
import { batchWorkflow } from '../workflows/batch';

const OPEN: ReadonlySet<string> = new Set(OPEN_STATUSES);
/** The activity of one webhook delivery attempt, as the workflow's history names it. */
const DELIVERY: keyof Activities = 'deliverBatchWebhook';
/** How far back a worker's first look goes: a run stopped while no worker ran is still found. */
const FIRST_LOOK_BACK_MS = 24 * 3_600_000;
/** Each look starts this long before the last one began: a run's close reaches visibility a little late. */
const OVERLAP_MS = 60_000;

/** Runs until `signal` aborts; a look that fails is logged and tried again at the next. */
export async function closeStoppedBatches(
  store: Store,
  client: Client,
  runs: BatchRuns,
  logger: Logger,
  opts: { everyMs: number; signal: AbortSignal },
): Promise<void> {
  let since = Date.now() - FIRST_LOOK_BACK_MS;
  while (!opts.signal.aborted) {
    const began = Date.now();
    try {
      await lookOnce(store, client, runs, logger, since, opts.signal);
      since = began - OVERLAP_MS;
    } catch (err) {
      logger.warn({ err }, 'batches whose runs were stopped in Temporal were not looked for; trying again');
    }
    await sleep(opts.everyMs, undefined, { signal: opts.signal, ref: false }).catch(() => undefined); // an abort ends the wait
  }
}

async function lookOnce(store: Store, client: Client, runs: BatchRuns, logger: Logger, since: number, signal: AbortSignal) {
  // One query per status: Temporal's SQL visibility then reads its index by status and close time
  // from `since` on (with both statuses in one IN, SQLite picks an index that reads every run
  // closed since: 0.2 against 35 ms on its schema holding 200,000 runs, 100,000 in the window).
  for (const status of ['Terminated', 'Canceled']) {
    const query = `WorkflowType = '${batchWorkflow.name}' AND ExecutionStatus = '${status}' AND CloseTime > '${new Date(since).toISOString()}'`;
    for await (const run of client.workflow.list({ query })) {
      if (signal.aborted) return;
      const b = await readBatch(store, run.workflowId);
      if (!b) continue;
      if (!OPEN.has(b.status)) {
        // Closed, and stopped while it retried its webhook: its record says the delivery was given
        // up, rather than nothing for good.
        if (b.callback_url && !b.webhook && (await isLatestRun(client, run.workflowId, run.runId))) {
          await recordWebhookOutcome(store, b._id, await stoppedDelivery(client, run.workflowId, run.runId));
        }
        continue;
      }
      const state = await runs.recover(b);
      if (state === 'cancelled') {
        logger.info(
          { batch_id: b._id, workspace_id: b.workspace_id, run_status: run.status.name },
          'batch being closed cancelled: its run was stopped in Temporal',
        );
      }
    }
  }
}

/**
 * Whether the stopped run is the batch's last: a later run (the one that closed a stopped batch
 * cancelled) may be delivering its webhook now, and records the outcome itself.
 */
async function isLatestRun(client: Client, workflowId: string, runId: string): Promise<boolean> {
  return (await client.workflow.getHandle(workflowId).describe()).runId === runId;
}

/** A webhook delivery cut short by its run's stop: the attempts that run made, none of which was taken. */
async function stoppedDelivery(client: Client, workflowId: string, runId: string): Promise<NonNullable<BatchDoc['webhook']>> {
  const history = await client.workflow.getHandle(workflowId, runId).fetchHistory();
  const attempts = (history.events ?? []).filter((e) => e.activityTaskScheduledEventAttributes?.activityType?.name === DELIVERY).length;
  return { status: 'failed', attempts, last_status: null, last_error: 'the delivery was stopped in Temporal before a receiver took it' };
}
