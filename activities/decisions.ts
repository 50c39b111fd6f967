import { Context } from '@temporalio/activity';
import type { UsageLedger } from '../domain/accounts/usage-ledger';
import { decisionService, type DecisionJob, type DecisionResult } from '../domain/decisions/service';
import type { Upstreams } from '../domain/routing/upstreams';
import type { Broadcaster } from '../domain/traces/broadcast';
import { toActivityFailure } from '../infrastructure/temporal/failures';
import type { DecisionHandoff } from '../infrastructure/temporal/decision-handoff';

export type { DecisionJob, DecisionResult } from '../domain/decisions/service';

export function createDecisionActivities({
  upstreams,
  usage,
  broadcast,
  handoff,
}: {
  upstreams: Upstreams;
  usage: UsageLedger;
  broadcast?: Broadcaster;
  /** Where this process's HTTP handlers wait for the decisions they started. */
  handoff?: DecisionHandoff;
}) {
  // A workflow's activity may run on any worker: its record is in the database before it completes.
  const decide = decisionService({ upstreams, record: (r) => usage.recordStored(r), broadcast });
  return {
    /**
     * The decision service as the workflow mode's local activity (cancelled through its context);
     * a gateway error leaves as a non-retryable failure that `fromWorkflowFailure` reads back.
     */
    async evaluateDecision(job: DecisionJob, signal: AbortSignal = Context.current().cancellationSignal): Promise<DecisionResult> {
      const attempt = async () => {
        try {
          return await decide(job, signal);
        } catch (err) {
          throw toActivityFailure(err);
        }
      };
      return handoff ? handoff.decide(job.generationId, attempt) : attempt();
    },
  };
}
