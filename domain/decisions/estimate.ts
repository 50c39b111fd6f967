// What a decision may cost, worked out before any provider is called, so the workspace can hold
// that much while the call runs (domain/accounts/spend-admission). Meant to be at least the real cost:
// one token per 3 bytes of prompt (tokenizers average about 4), the priciest endpoint the model
// could fall back to, and generous output.
import { costOf } from '../catalog/usd';
import { servesOperation } from '../routing/engine';
import type { CatalogModel } from '../catalog';
import type { DecisionsRequest } from './types';

/** Room for the prompt around the state and question (instructions, labels). */
const PROMPT_OVERHEAD_TOKENS = 256;
const OUTPUT_TOKENS_PER_QUESTION = 16;

/** `stateBytes`: the state's size as JSON, which the handler has already measured for its limit. */
export function estimateDecisionCost(model: CatalogModel, request: Pick<DecisionsRequest, 'questions'> & { stateBytes: number }): number {
  const tokens = (value: unknown) => Math.ceil(Buffer.byteLength(JSON.stringify(value) ?? '') / 3);
  const questions = Object.values(request.questions);
  const state = Math.ceil(request.stateBytes / 3);
  const output_tokens = OUTPUT_TOKENS_PER_QUESTION * questions.length;
  // Native endpoints answer every question in one call; chat endpoints take one call per question.
  // Each worked out once, on first need, whatever the number of endpoints (JSON.stringify showed in the profile).
  let native: { input_tokens: number; output_tokens: number } | undefined;
  let chat: { input_tokens: number; output_tokens: number } | undefined;
  const usageOn = (isNative: boolean) =>
    isNative
      ? (native ??= { input_tokens: state + tokens(request.questions) + PROMPT_OVERHEAD_TOKENS, output_tokens })
      : (chat ??= { input_tokens: questions.reduce((n, q) => n + state + tokens(q) + PROMPT_OVERHEAD_TOKENS, 0), output_tokens });
  let most = 0;
  for (const e of model.endpoints) {
    const isNative = servesOperation(e, 'systemone');
    const calls = isNative ? 1 : questions.length;
    // A per-request fee is charged per call.
    const cost = costOf(e, usageOn(isNative)) + (calls - 1) * (e.entry.pricing.request ?? 0);
    most = Math.max(most, cost);
  }
  return most;
}
