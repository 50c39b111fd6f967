import { Context } from '@temporalio/activity';
import type { UsageLedger } from '../accounts/usage-ledger';
import { evaluate } from '../decisions/evaluate';
import { PROMPT_FORMAT } from '../decisions/prompt';
import type { DecisionsRequest, Answer } from '../decisions/types';
import type { RequestMeta } from '../accounts/attribution';
import type { Upstreams } from '../routing/upstreams';
import { toActivityFailure } from '../temporal/failures';

export interface DecisionJob {
  generationId: string;
  workspaceId: string;
  keyId: string;
  request: DecisionsRequest;
  meta: RequestMeta;
  workspace: { only?: string[]; ignore?: string[] };
}

export interface DecisionResult {
  id: string;
  model: string;
  provider: string;
  answers: Record<string, Answer>;
  usage: { input_tokens: number; output_tokens: number; cost: number };
}

export function createDecisionActivities({ upstreams, usage }: { upstreams: Upstreams; usage: UsageLedger }) {
  return {
    /**
     * Evaluates and records usage; answers only once the usage record is written. A retry re-asks
     * the provider but cannot debit twice. The worker runs it as a local activity (cancelled through
     * its context); the API's inline mode calls this same function directly with its own signal.
     * Either way a gateway error leaves as a non-retryable failure that `fromWorkflowFailure` reads.
     */
    async evaluateDecision(job: DecisionJob, signal: AbortSignal = Context.current().cancellationSignal): Promise<DecisionResult> {
      try {
        const e = await evaluate(upstreams, job.request, { workspace: job.workspace, signal });
        await usage.record({
          _id: job.generationId,
          workspace_id: job.workspaceId,
          key_id: job.keyId,
          kind: 'decision',
          model: e.model,
          provider: e.provider,
          input_tokens: e.usage.input_tokens,
          output_tokens: e.usage.output_tokens,
          cost: e.cost,
          session_id: job.meta.session_id,
          user: job.meta.user,
          trace: job.meta.trace,
          app: job.meta.app,
          batch_id: null,
          ...(e.labelMass ? { details: { label_mass: e.labelMass, prompt_format: PROMPT_FORMAT } } : {}),
        });
        return { id: job.generationId, model: e.model, provider: e.provider, answers: e.answers, usage: { ...e.usage, cost: e.cost } };
      } catch (err) {
        throw toActivityFailure(err);
      }
    },
  };
}
