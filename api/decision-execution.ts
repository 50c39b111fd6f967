// How the API runs a decision, in one of two modes that share the work and its outcome:
// - `inline`: the handler calls the decision service (domain/decisions/service) in this process, with a
//   signal that fires on the request's timeout or when the client goes away. No Temporal at all:
//   its errors reach the error middleware as they were thrown.
// - `workflow`: an eagerly started workflow (id = generation id) runs the same function as a local
//   activity on this process's worker, and its result is handed back in-process, so every decision
//   is in Temporal's history and Web UI.
// Both raise the same gateway errors (the workflow mode reads them back with `fromWorkflowFailure`).
import { WorkflowNotFoundError, type Client, type WorkflowHandle } from '@temporalio/client';
import type { Decide, DecisionJob, DecisionResult } from '../domain/decisions/service';
import { DECISION_RUN_TIMEOUT_MS, type DecisionHandoff } from '../infrastructure/temporal/decision-handoff';
import { ownerShare, Semaphore } from '../infrastructure/concurrency/semaphore';
import { ServiceUnavailableError } from '../infrastructure/errors';
import { answeredWithin, fromWorkflowFailure, orchestrationUnavailable } from '../infrastructure/temporal/failures';
import { decisionWorkflow } from '../workflows/decision';

type DecisionExecutionMode = 'inline' | 'workflow';

export interface DecisionExecution {
  readonly mode: DecisionExecutionMode;
  run(job: DecisionJob, signal: AbortSignal): Promise<DecisionResult>;
}

export function inlineExecution(decide: Decide): DecisionExecution {
  return { mode: 'inline', run: decide };
}

/**
 * `maxInFlight`: decisions this process runs as workflows at once; the rest wait in line. Past
 *   the worker's free slots an eager start falls back to the server's task matching, several times
 *   slower, and the dev server's throughput falls as its load grows: queueing here keeps every
 *   start eager and the throughput at its peak instead of collapsing under concurrency.
 */
export function workflowExecution(
  temporal: Client,
  handoff: DecisionHandoff,
  { taskQueue, maxInFlight, answerWithinMs }: { taskQueue: string; maxInFlight: number; answerWithinMs: number },
): DecisionExecution {
  // One workspace runs at most three quarters of them: a flood of one workspace's decisions leaves
  // the others a quarter to start theirs at once, instead of waiting behind the whole flood.
  const slots = new Semaphore(maxInFlight, ownerShare(maxInFlight));
  return {
    mode: 'workflow',
    run: async (job, signal) => {
      // Leaving the line is the client's to do; once started, the workflow's own timeout bounds it
      // and a client that goes away does not cancel a run that is being recorded.
      const release = await slots.acquire({
        owner: job.workspaceId,
        capped: true,
        signal,
        onAbort: () => new ServiceUnavailableError('Decision was cancelled before it started'),
      });
      // A server that does not take the start in time (frozen, overloaded) is a 503, not a wait for
      // as long as it stays so; a start that lands later begins too late to decide (the workflow).
      const start = () =>
        answeredWithin(
          temporal.workflow.start(decisionWorkflow, {
            workflowId: job.generationId,
            taskQueue,
            requestEagerStart: true,
            workflowExecutionTimeout: DECISION_RUN_TIMEOUT_MS,
            // What the Web UI lists for this run; ids only, never the caller's text.
            staticSummary: `decision · ${job.request.model} · ${Object.keys(job.request.questions).length} question(s) · workspace ${job.workspaceId} · key ${job.keyId}`,
            args: [job, { startBy: Date.now() + answerWithinMs }],
          }),
          answerWithinMs,
        );
      try {
        return await handoff.execute(job.generationId, () => startOrFind(temporal, job.generationId, start, answerWithinMs));
      } catch (err) {
        throw fromWorkflowFailure(err);
      } finally {
        release();
      }
    },
  };
}

/**
 * Starts a decision's workflow. A start that failed may still have reached the server, with only
 * its answer lost (a slow server, a dropped connection): then the run decides, and bills, all the
 * same. So its result is asked of the server; only a run the server does not have is a failed start.
 * A server that does not answer that question in time either is a 503.
 */
async function startOrFind(
  temporal: Client,
  workflowId: string,
  start: () => Promise<WorkflowHandle & { readonly eagerlyStarted: boolean }>,
  answerWithinMs: number,
): Promise<Pick<WorkflowHandle, 'result'> & { readonly eagerlyStarted: boolean }> {
  try {
    return await start();
  } catch {
    const handle = temporal.workflow.getHandle(workflowId);
    try {
      await answeredWithin(handle.describe(), answerWithinMs);
    } catch (found) {
      if (found instanceof WorkflowNotFoundError) throw new ServiceUnavailableError('The decision could not be started; try again');
      // The server cannot say (down, frozen): the run may exist, but one that begins late decides nothing.
      throw orchestrationUnavailable();
    }
    return { result: () => handle.result(), eagerlyStarted: false };
  }
}
