// A batch's runs of its workflow, as the API and the admin CLI start them: the first one, before
// the batch is stored, and a new one for a stored batch whose run is gone (terminated in the Web
// UI, failed, or lost with Temporal's state). Chunks resume from their progress documents, so a new
// run finishes the batch without running a finished line again.
import { WorkflowExecutionAlreadyStartedError, WorkflowNotFoundError, type Client } from '@temporalio/client';
import { WorkflowIdReusePolicy } from '@temporalio/common';
import type { BatchDoc } from '../domain/batches/store';
import type { Catalog } from '../domain/catalog';
import type { Config } from '../infrastructure/config';
import { batchWorkflow, batchWorkflowStart, cancelBatchSignal } from '../workflows/batch';
import { answeredWithin } from '../infrastructure/temporal/failures';

/**
 * What became of a stored batch's run when it was looked at: still running, a new run started, a
 * run that ended by itself (it closed the batch), or a new run that closes the batch cancelled
 * because an operator stopped the last one.
 */
export type RunState = 'running' | 'started' | 'ended' | 'cancelled';

export class BatchRuns {
  constructor(
    private readonly client: Client,
    private readonly config: Pick<Config, 'batches' | 'webhooks'> & { temporal: Pick<Config['temporal'], 'taskQueue' | 'answerWithinMs'> },
    /** Names a new run's model as the first run did: the catalog's id, not the alias a client wrote. */
    private readonly catalog: Pick<Catalog, 'resolve'>,
  ) {}

  private startOptions(doc: BatchDoc, modelId: string) {
    const { batches, webhooks } = this.config;
    return batchWorkflowStart(doc, modelId, {
      taskQueue: this.config.temporal.taskQueue,
      window: batches.window,
      heartbeatTimeoutMs: batches.heartbeatTimeoutMs,
      createdWithinMs: batches.createdWithinMs,
      webhook: doc.callback_url ? { windowMs: webhooks.retryWindowMs, firstRetryMs: webhooks.firstRetryMs } : null,
    });
  }

  /** A call to Temporal, or the 503 of an unavailable orchestration once it has not answered within 10 s (`temporal.answerWithinMs`). */
  private within<T>(call: Promise<T>): Promise<T> {
    return answeredWithin(call, this.config.temporal.answerWithinMs);
  }

  /** Starts a new batch's workflow, before the batch is stored (see the create route). */
  async first(doc: BatchDoc, modelId: string): Promise<void> {
    await this.within(this.client.workflow.start(batchWorkflow, this.startOptions(doc, modelId)));
  }

  /**
   * Asks a stored batch's run to cancel it; a batch with no run gets a new one that closes it
   * cancelled. 'ended' when its run had ended by itself, having closed the batch.
   */
  async cancel(b: BatchDoc): Promise<RunState> {
    // A batch stored as cancelling has had its cancel: each signal is four events of the
    // workflow's history (Temporal ends a run at 51,200), so a client cancelling in a loop would
    // otherwise grow it by as many. Its run is only looked at.
    if (b.status === 'cancelling') return (await this.runStatus(b._id)) === 'RUNNING' ? 'running' : this.again(b, true);
    try {
      await this.within(this.client.workflow.getHandle(b._id).signal(cancelBatchSignal));
      return 'running';
    } catch (err) {
      if (!(err instanceof WorkflowNotFoundError)) throw err;
      return this.again(b, true);
    }
  }

  /**
   * Gives a stored open batch a run again if it has none. A run that is gone (Temporal's state
   * lost) or failed is followed by one that goes on from where the chunks stopped. A run an
   * operator stopped (terminated or cancelled in the Web UI or CLI) is followed by one that closes
   * the batch cancelled, its finished lines kept: what was stopped is not spent again.
   */
  async recover(b: BatchDoc): Promise<RunState> {
    const run = await this.runStatus(b._id);
    if (run === 'RUNNING') return 'running';
    if (run === 'TERMINATED' || run === 'CANCELLED') {
      const state = await this.again(b, true);
      return state === 'started' ? 'cancelled' : state;
    }
    return this.again(b, b.status === 'cancelling');
  }

  /** How the batch's workflow's latest run stands (`RUNNING`, `TERMINATED`, …); null when Temporal has none. */
  private async runStatus(id: string): Promise<string | null> {
    try {
      return (await this.within(this.client.workflow.getHandle(id).describe())).status.name;
    } catch (err) {
      if (err instanceof WorkflowNotFoundError) return null;
      throw err;
    }
  }

  /**
   * A new run for a stored batch: the document is there (nothing to wait for), the last run's
   * activities are given time to stop first, and a batch that was being cancelled is cancelled.
   * Started only where no run ended by itself: one that did has closed the batch, which stays as
   * it is.
   */
  private async again(b: BatchDoc, cancel: boolean): Promise<RunState> {
    let modelId = b.model; // a model taken out of the catalog since: as the client named it
    try {
      modelId = this.catalog.resolve(b.model).model.id;
    } catch {
      /* kept as named */
    }
    const start = this.startOptions(b, modelId);
    start.args[0] = { ...start.args[0], creation: undefined, cancelRequested: cancel, followsLostRun: true };
    try {
      await this.within(
        this.client.workflow.start(batchWorkflow, { ...start, workflowIdReusePolicy: WorkflowIdReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY }),
      );
      return 'started';
    } catch (err) {
      if (!(err instanceof WorkflowExecutionAlreadyStartedError)) throw err;
      // Another caller's new run, or one that ended by itself.
      return (await this.runStatus(b._id)) === 'RUNNING' ? 'running' : 'ended';
    }
  }
}
