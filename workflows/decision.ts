import { proxyLocalActivities } from '@temporalio/workflow';
import type { Activities, DecisionJob, DecisionResult } from '../activities';

// A local activity: it runs in the worker that took the workflow task, with no extra round trip
// through the server, which is what keeps a synchronous decision fast.
const { evaluateDecision } = proxyLocalActivities<Activities>({
  startToCloseTimeout: '2 minutes',
  retry: { maximumAttempts: 3, initialInterval: '200 ms', nonRetryableErrorTypes: ['GatewayError'] },
});

/** One decision request (workflow id = its generation id): evaluate, record usage, answer. */
export async function decisionWorkflow(job: DecisionJob): Promise<DecisionResult> {
  return evaluateDecision(job);
}
