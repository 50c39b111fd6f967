import { proxyLocalActivities, proxySinks, type Sinks } from '@temporalio/workflow';
import type { Activities, DecisionJob, DecisionResult } from '../activities';
import { GATEWAY_ERROR_TYPE } from './shared';

// A local activity: it runs in the worker that took the workflow task, with no extra round trip
// through the server, which is what keeps a synchronous decision fast.
const { evaluateDecision } = proxyLocalActivities<Activities>({
  startToCloseTimeout: '2 minutes',
  retry: { maximumAttempts: 3, initialInterval: '200 ms', nonRetryableErrorTypes: [GATEWAY_ERROR_TYPE] },
});

/** How a decision tells the HTTP handler in its own process that it is done (infrastructure/temporal/decision-handoff). */
export interface DecisionSinks extends Sinks {
  decisions: {
    answered(generationId: string, result: DecisionResult): void;
    failed(generationId: string): void;
  };
}

const { decisions } = proxySinks<DecisionSinks>();

/** One decision request (workflow id = its generation id): evaluate, record usage, answer. */
export async function decisionWorkflow(job: DecisionJob): Promise<DecisionResult> {
  try {
    const result = await evaluateDecision(job);
    decisions.answered(job.generationId, result);
    return result;
  } catch (err) {
    // The failure's details travel through the server; the handler fetches them from there.
    decisions.failed(job.generationId);
    throw err;
  }
}
