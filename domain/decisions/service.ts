// A decision as a service: evaluate the questions against the catalog's models, bill the call
// through the usage ledger, answer. Called directly by the API's inline mode and wrapped by the
// decision activity for the workflow mode; gateway errors leave as they are.
import { usageRecordOf, type UsageRecord } from '../accounts/usage-ledger';
import type { RequestMeta } from '../accounts/attribution';
import { sessionKey, type Upstreams } from '../routing/upstreams';
import type { Broadcaster } from '../traces/broadcast';
import { evaluate } from './evaluate';
import { PROMPT_FORMAT } from './prompt';
import type { Answer, DecisionsRequest } from './types';
import { withFields } from '../../infrastructure/objects/with-fields';

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
  /** Each question's provider, when questions were answered by more than one. */
  providers?: Record<string, string>;
  answers: Record<string, Answer>;
  usage: { input_tokens: number; output_tokens: number; cost: number };
}

export type Decide = (job: DecisionJob, signal: AbortSignal) => Promise<DecisionResult>;

/**
 * Evaluates and records usage; answers only once `record` says the usage record is safe (journaled
 * inline, stored in workflow mode). A retry re-asks the provider but cannot debit twice.
 */
export function decisionService({
  upstreams,
  record,
  broadcast,
}: {
  upstreams: Upstreams;
  record: (usage: UsageRecord) => Promise<unknown>;
  broadcast?: Pick<Broadcaster, 'generation'>;
}): Decide {
  return async (job, signal) => {
    const startedAt = Date.now();
    const session = sessionKey(job.workspaceId, job.meta.session_id);
    const e = await evaluate(upstreams, job.request, { workspaceId: job.workspaceId, workspace: job.workspace, signal, session });
    const details = {
      ...(e.labelMass && { label_mass: e.labelMass, prompt_format: PROMPT_FORMAT }),
      ...(e.providers && { providers: e.providers }),
    };
    await record(
      usageRecordOf(
        { generationId: job.generationId, workspaceId: job.workspaceId, keyId: job.keyId, kind: 'decision', meta: job.meta },
        { model: e.model, provider: e.provider, usage: e.usage, cost: e.cost },
        Object.keys(details).length ? details : undefined,
      ),
    );
    const { model, provider, providers, answers } = e;
    broadcast?.generation({
      workspaceId: job.workspaceId,
      id: job.generationId,
      api: 'decision',
      kind: 'decision',
      requestedModel: job.request.model,
      model,
      provider,
      usage: e.usage,
      cost: e.cost,
      finishReason: null,
      startedAt,
      endedAt: Date.now(),
      meta: job.meta,
      content: () => ({ input: { state: job.request.state, questions: job.request.questions }, output: answers }),
    });
    return {
      id: job.generationId,
      model,
      provider,
      ...(providers && { providers }),
      answers,
      usage: withFields(e.usage, { cost: e.cost }),
    };
  };
}
