// Batch activities: Temporal's entry points into the batch service (domain/batches/service.ts).
// Each passes in the activity's heartbeat and cancellation, and reports a cancelled chunk as
// Temporal's CancelledFailure; the steps themselves are idempotent (see the service).
import { Context } from '@temporalio/activity';
import { ApplicationFailure, CancelledFailure } from '@temporalio/common';
import { batchService, BatchNotCreated, ChunkCancelled, type BatchDeps, type Creation, type StepControl } from '../domain/batches/service';
import { BATCH_NOT_CREATED } from '../workflows/shared';
import type { BatchDoc, BatchStatus } from '../domain/batches/store';
import type { DeliveryOutcome } from '../domain/webhooks/deliver';

export type { BatchDeps } from '../domain/batches/service';

type Closing = Extract<BatchStatus, 'completed' | 'failed' | 'expired' | 'cancelled'>;

/** The running activity's heartbeat, bound as it starts: its context is there only until its first await (infrastructure/temporal/activity-context.ts). */
function heartbeat(): (details?: unknown) => void {
  const ctx = Context.current();
  return (details) => ctx.heartbeat(details);
}

export function createBatchActivities(deps: BatchDeps) {
  const service = batchService(deps);
  /**
   * Runs a step with the activity's heartbeat and cancellation: a stopped chunk is Temporal's
   * CancelledFailure, a batch never created a failure that is not retried (the workflow ends).
   */
  const chunkWork = async <T>(work: (control: StepControl) => Promise<T>): Promise<T> => {
    try {
      return await work({ heartbeat: heartbeat(), signal: Context.current().cancellationSignal });
    } catch (err) {
      if (err instanceof ChunkCancelled) throw new CancelledFailure(err.message);
      if (err instanceof BatchNotCreated) throw ApplicationFailure.nonRetryable(err.message, BATCH_NOT_CREATED);
      throw err;
    }
  };
  return {
    /**
     * Checks every line; with `start`, a batch whose lines are all valid is marked in_progress. Only
     * runs started before the API handed its check to the workflow call it (workflows/batch.ts).
     */
    validateBatchLines(batchId: string, start = false): Promise<{ invalid: number; examples: string[] }> {
      return service.validateLines(batchId, start, heartbeat());
    },

    /** One attempt to post the terminal batch to its callback URL (the workflow retries). */
    deliverBatchWebhook(batchId: string): Promise<DeliveryOutcome> {
      return service.deliverWebhook(batchId);
    },

    recordWebhookOutcome(batchId: string, outcome: NonNullable<BatchDoc['webhook']>): Promise<void> {
      return service.recordWebhookOutcome(batchId, outcome);
    },

    setBatchStatus(batchId: string, status: BatchStatus): Promise<void> {
      return service.setStatus(batchId, status);
    },

    /** Runs one chunk's lines; returns the chunk's counts. */
    processBatchChunk(batchId: string, chunkIndex: number, creation?: Creation): Promise<{ completed: number; failed: number }> {
      return chunkWork((control) => service.runChunk(batchId, chunkIndex, control, creation));
    },

    /** Runs the lines of a batch that is one chunk, then closes it completed; returns the counts. */
    processOnlyChunk(batchId: string, creation?: Creation): Promise<{ completed: number; failed: number }> {
      return chunkWork((control) => service.runOnlyChunk(batchId, control, creation));
    },

    /** Closes a batch with its terminal status (finalizing first, for a completed batch). */
    closeBatch(
      batchId: string,
      status: Closing,
      errorMessage: string | null = null,
      finalizing = false,
      creation?: Creation,
    ): Promise<void> {
      return chunkWork((control) => service.closeBatch(batchId, status, errorMessage, finalizing, control, creation));
    },
  };
}
