import { proxyLocalActivities } from '@temporalio/workflow';
import type { Activities, DecisionJob, DecisionResult } from '../activities';
import { GATEWAY_ERROR_TYPE, gatewayFailure } from './shared';

// A local activity: it runs in the worker that took the workflow task, with no extra round trip
// through the server, which is what keeps a synchronous decision fast.
const { evaluateDecision } = proxyLocalActivities<Activities>({
  startToCloseTimeout: '2 minutes',
  retry: { maximumAttempts: 3, initialInterval: '200 ms', nonRetryableErrorTypes: [GATEWAY_ERROR_TYPE] },
});

/** How the API started the run. */
export interface DecisionRun {
  /**
   * When the API stops waiting for the start to be taken (epoch ms). A run whose first task comes
   * later began after its client was answered 503 (a frozen or overloaded server): it decides nothing.
   */
  startBy?: number;
}

/**
 * One decision request (workflow id = its generation id): evaluate, record usage, answer. The
 * activity hands its result to the HTTP handler in its own process (infrastructure/temporal/decision-handoff).
 */
export async function decisionWorkflow(job: DecisionJob, run: DecisionRun = {}): Promise<DecisionResult> {
  // The workflow's clock is its task's start, as the server recorded it.
  if (run.startBy !== undefined && Date.now() > run.startBy) {
    throw gatewayFailure('The decision could not be started in time; try again', { status: 503, metadata: null });
  }
  return evaluateDecision(job);
}
