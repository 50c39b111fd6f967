// Evaluates one decision request against the catalog: native System One endpoints answer all
// questions in one call; chat endpoints answer one question per call, in parallel, from label
// log-probabilities. Returns answers, usage and cost; recording usage is the caller's job.
import type { Upstreams } from '../routing/upstreams';
import { invoke } from '../routing/upstreams';
import { servesOperation } from '../routing/engine';
import { answerFromDistribution, answerFromNative } from './answers';
import { logprobRequest, readLabelDistribution } from './prompt';
import type { Answer, DecisionsRequest } from './types';
import { roundUsd } from '../catalog/usd';

export interface Evaluation {
  model: string;
  provider: string;
  answers: Record<string, Answer>;
  usage: { input_tokens: number; output_tokens: number };
  cost: number;
  /** Per question, for chat endpoints: the probability the model put on the labels at all. */
  labelMass: Record<string, number> | null;
}

export async function evaluate(
  up: Upstreams,
  request: DecisionsRequest,
  opts: { workspace?: { only?: string[]; ignore?: string[] }; signal?: AbortSignal } = {},
): Promise<Evaluation> {
  const { model, variant } = up.catalog.resolve(request.model);
  const common = { models: [model], variant, preferences: request.provider ?? undefined, workspace: opts.workspace, signal: opts.signal };
  const native = model.endpoints.some((e) => servesOperation(e, 'systemone'));

  if (native) {
    const r = await invoke(up, { ...common, operation: 'systemone', body: { state: request.state, questions: request.questions } });
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
      const r = await invoke(up, { ...common, operation: 'chat', body, parameters: ['logprobs', 'top_logprobs'] });
      const { probabilities, labelMass } = readLabelDistribution(r.body, labels, r.endpoint.provider.slug);
      return { name, answer: answerFromDistribution(q, probabilities), labelMass, r };
    }),
  );
  return {
    model: model.canonicalId,
    provider: results[0].r.endpoint.provider.slug,
    answers: Object.fromEntries(results.map((x) => [x.name, x.answer])),
    usage: {
      input_tokens: results.reduce((s, x) => s + x.r.usage.input_tokens, 0),
      output_tokens: results.reduce((s, x) => s + x.r.usage.output_tokens, 0),
    },
    cost: roundUsd(results.reduce((s, x) => s + x.r.cost, 0)),
    labelMass: Object.fromEntries(results.map((x) => [x.name, x.labelMass])),
  };
}
