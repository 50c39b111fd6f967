// Native System One providers: typed decisions in one call, bearer-token auth, no streaming.
import type { ProviderFormat } from './format';
import { failureFrom, tokens } from './format';

export const systemone: ProviderFormat = {
  paths: { systemone: '/v1/systemone' },

  headers: (apiKey): Record<string, string> => (apiKey ? { authorization: `Bearer ${apiKey}` } : {}),

  streamBody: (_operation, body) => ({ ...body, stream: true }),

  usageOf(_operation, body) {
    const u = body?.usage ?? {};
    return { input_tokens: tokens(u.input_tokens), output_tokens: tokens(u.output_tokens) };
  },

  failureOf(status, body, provider, retryAfterMs) {
    const b = body as Record<string, any> | null;
    return failureFrom(status, b && typeof b.error === 'object' ? b.error : b, provider, retryAfterMs);
  },

  streamError: () => null,
};
