// Native System One providers: typed decisions in one call, bearer-token auth, no streaming.
import type { ProviderFormat } from './format';
import { anthropic } from './anthropic';
import { withFields } from '../../objects/with-fields';

export const systemone: ProviderFormat = {
  paths: { systemone: '/v1/systemone' },

  headers: (apiKey): Record<string, string> => (apiKey ? { authorization: `Bearer ${apiKey}` } : {}),
  tiers: {},

  streamBody: (_operation, body) => withFields(body, { stream: true }),

  // Usage and errors in the same shape as Anthropic's: input/output token counts, an `error` object.
  usageOf: anthropic.usageOf,
  failureOf: anthropic.failureOf,

  streamError: () => null,
};
