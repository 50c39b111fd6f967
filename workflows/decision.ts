import { proxyLocalActivities } from '@temporalio/workflow';
import type { Activities, DecisionJob, DecisionResult } from '../activities';
import { GATEWAY_ERROR_TYPE } from './shared';

// A local activity: it runs in the worker that took the workflow task, with no extra round trip
// through the server, which is what keeps a synchronous decision fast.
const { evaluateDecision } = proxyLocalActivities<Activities>({
  startToCloseTimeout: '2 minutes',
  retry: { maximumAttempts: 3, initialInterval: '200 ms', nonRetryableErrorTypes: [GATEWAY_ERROR_TYPE] },
});

/**
 * One decision request (workflow id = its generation id): evaluate, record usage, answer. The
 * activity hands its result to the HTTP handler in its own process (infrastructure/temporal/decision-handoff).
 */
export async function decisionWorkflow(job: DecisionJob): Promise<DecisionResult> {
  return evaluateDecision(job);
}
