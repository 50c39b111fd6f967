// How the API runs a decision, in one of two modes that share the work and its outcome:
// - `inline`: the handler calls the decision activity function itself, in this process, with a
//   signal that fires on the request's timeout or when the client goes away. No Temporal round trip.
// - `workflow`: an eagerly started workflow (id = generation id) runs the same function as a local
//   activity on this process's worker, and its result is handed back in-process, so every decision
//   is in Temporal's history and Web UI.
// Both raise the same gateway errors (`fromWorkflowFailure` reads the activity's failure either way).
import type { Client } from '@temporalio/client';
import type { Activities, DecisionJob, DecisionResult } from '../activities';
import type { DecisionHandoff } from '../temporal/decision-handoff';
import { fromWorkflowFailure } from '../temporal/failures';
import type { decisionWorkflow } from '../workflows';

export type DecisionExecutionMode = 'inline' | 'workflow';

export interface DecisionExecution {
  readonly mode: DecisionExecutionMode;
  run(job: DecisionJob, signal: AbortSignal): Promise<DecisionResult>;
}

export function inlineExecution(activities: Pick<Activities, 'evaluateDecision'>): DecisionExecution {
  return {
    mode: 'inline',
    run: (job, signal) => activities.evaluateDecision(job, signal).catch((err: unknown) => { throw fromWorkflowFailure(err); }),
  };
}

export function workflowExecution(temporal: Client, handoff: DecisionHandoff, taskQueue: string): DecisionExecution {
  return {
    mode: 'workflow',
    // The workflow's own timeout bounds it; a client that leaves does not cancel a recorded run.
    run: (job) => handoff.execute(job.generationId, () => temporal.workflow.start<typeof decisionWorkflow>('decisionWorkflow', {
      workflowId: job.generationId,
      taskQueue,
      requestEagerStart: true,
      workflowExecutionTimeout: '3 minutes',
      args: [job],
    })).catch((err: unknown) => { throw fromWorkflowFailure(err); }),
  };
}
