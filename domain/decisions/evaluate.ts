// Evaluates one decision request against the catalog: native System One endpoints answer all
// questions in one call; chat endpoints answer one question per call, in parallel, from label
// log-probabilities. Returns answers, usage and cost; recording usage is the caller's job.
import type { CatalogModel } from '../catalog';
import type { Upstreams } from '../routing/upstreams';
import { invoke } from '../routing/upstreams';
import { servesOperation } from '../routing/engine';
import { answerFromDistribution, answerFromNative } from './answers';
import { logprobRequest, readLabelDistribution } from './prompt';
import type { Answer, DecisionsRequest } from './types';
import { roundUsd } from '../catalog/usd';
import { withFields } from '../../infrastructure/objects/with-fields';

export interface Evaluation {
  model: string;
  /** The provider that answered (the one that answered most questions, when they were routed apart). */
  provider: string;
  /** Each question's provider, only when questions were answered by more than one. */
  providers?: Record<string, string>;
  answers: Record<string, Answer>;
  usage: { input_tokens: number; output_tokens: number };
  cost: number;
  /** Per question, for chat endpoints: the probability the model put on the labels at all. */
  labelMass: Record<string, number> | null;
}

export async function evaluate(
  up: Upstreams,
  request: DecisionsRequest,
  opts: { workspaceId?: string; workspace?: { only?: string[]; ignore?: string[] }; signal?: AbortSignal; session?: string } = {},
): Promise<Evaluation> {
  const { model, variant } = up.catalog.resolve(request.model);
  const common = {
    workspaceId: opts.workspaceId,
    models: [model],
    variant,
    preferences: request.provider ?? undefined,
    workspace: opts.workspace,
    signal: opts.signal,
    session: opts.session,
  };
  const native = answeredNatively(model);

  if (native) {
    const r = await invoke(
      up,
      withFields(common, { operation: 'systemone' as const, body: { state: request.state, questions: request.questions } }),
    );
    const answers: Record<string, Answer> = {};
    for (const [name, q] of Object.entries(request.questions))
      answers[name] = answerFromNative(q, r.body?.answers?.[name], name, r.endpoint.provider.slug);
    return { model: model.canonicalId, provider: r.endpoint.provider.slug, answers, usage: r.usage, cost: r.cost, labelMass: null };
  }

  const names = Object.keys(request.questions);
  const results = await Promise.all(
    names.map(async (name) => {
      const q = request.questions[name];
      const { body, labels } = logprobRequest(request.state, q);
      const r = await invoke(up, withFields(common, { operation: 'chat' as const, body, parameters: ['logprobs', 'top_logprobs'] }));
      const { probabilities, labelMass } = readLabelDistribution(r.body, labels, r.endpoint.provider.slug);
      return { name, answer: answerFromDistribution(q, probabilities), labelMass, r };
    }),
  );
  return {
    model: model.canonicalId,
    ...servedBy(results.map((x) => [x.name, x.r.endpoint.provider.slug])),
    answers: Object.fromEntries(results.map((x) => [x.name, x.answer])),
    usage: {
      input_tokens: results.reduce((s, x) => s + x.r.usage.input_tokens, 0),
      output_tokens: results.reduce((s, x) => s + x.r.usage.output_tokens, 0),
    },
    cost: roundUsd(results.reduce((s, x) => s + x.r.cost, 0)),
    labelMass: Object.fromEntries(results.map((x) => [x.name, x.labelMass])),
  };
}

/** A model with a native System One endpoint is asked once for every question; one without, once per question on its chat endpoints. */
export function answeredNatively(model: CatalogModel): boolean {
  return model.endpoints.some((e) => servesOperation(e, 'systemone'));
}

/**
 * Who answered a decision whose questions were called one by one: the provider that answered most
 * of them (the first to, on a tie), and, when it was not the only one, each question's provider.
 */
export function servedBy(perQuestion: [name: string, provider: string][]): { provider: string; providers?: Record<string, string> } {
  const counts = new Map<string, number>();
  for (const [, p] of perQuestion) counts.set(p, (counts.get(p) ?? 0) + 1);
  let provider = perQuestion[0][1];
  for (const [p, n] of counts) if (n > counts.get(provider)!) provider = p;
  return counts.size > 1 ? { provider, providers: Object.fromEntries(perQuestion) } : { provider };
}
