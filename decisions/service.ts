// A decision as a service: evaluate the questions against the catalog's models, bill the call
// through the usage ledger, answer. Called directly by the API's inline mode and wrapped by the
// decision activity for the workflow mode; gateway errors leave as they are.
import type { UsageLedger } from '../accounts/usage-ledger';
import type { RequestMeta } from '../accounts/attribution';
import type { Upstreams } from '../routing/upstreams';
import { evaluate } from './evaluate';
import { PROMPT_FORMAT } from './prompt';
import type { Answer, DecisionsRequest } from './types';

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

export type Decide = (job: DecisionJob, signal: AbortSignal) => Promise<DecisionResult>;

/** Evaluates and records usage; answers only once the usage record is safe. A retry re-asks the provider but cannot debit twice. */
export function decisionService({ upstreams, usage }: { upstreams: Upstreams; usage: UsageLedger }): Decide {
  return async (job, signal) => {
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
  };
}
