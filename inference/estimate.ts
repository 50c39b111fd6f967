// Token counts worked out from a request's size, for the two times the gateway has no count from
// the provider: the hold before a call (meant to be at least the real cost: one token per 3 bytes,
// the priciest endpoint the call could fall back to, the most output allowed) and the bill for a
// call cut short before the provider reported its prompt tokens (about 4 bytes a token).
import type { CatalogModel } from '../catalog';
import { costOf } from '../providers/adapters';
import { servesOperation } from '../routing/engine';
import type { InferenceOperation } from './formats';

/** Output allowed when neither the request nor the endpoint says. */
const DEFAULT_MAX_OUTPUT = 4096;

export function estimateCompletionCost(
  models: CatalogModel[],
  operation: InferenceOperation,
  requestBytes: number,
  maxOutputTokens: number | null,
): number {
  let most = 0;
  for (const e of models.flatMap((m) => m.endpoints)) {
    if (!servesOperation(e, operation)) continue;
    const output = operation === 'embeddings' ? 0 : (maxOutputTokens ?? e.entry.max_completion_tokens ?? DEFAULT_MAX_OUTPUT);
    most = Math.max(most, costOf(e, { input_tokens: Math.ceil(requestBytes / 3), output_tokens: output }));
  }
  return most;
}

export function promptTokensEstimate(requestBytes: number): number {
  return Math.ceil(requestBytes / 4);
}
