// Anthropic Messages providers: `x-api-key` auth with a pinned API version, typed stream events.
import type { ProviderFormat } from './format';
import { eventJson, failureFrom, tokens } from './format';
import { UpstreamFailure } from '../failure';

export const anthropic: ProviderFormat = {
  paths: { messages: '/v1/messages' },

  headers: (apiKey) => ({ 'anthropic-version': '2023-06-01', ...(apiKey ? { 'x-api-key': apiKey } : {}) }),

  streamBody: (_operation, body) => ({ ...body, stream: true }),

  usageOf(_operation, body) {
    const u = body?.usage ?? {};
    return { input_tokens: tokens(u.input_tokens), output_tokens: tokens(u.output_tokens) };
  },

  failureOf(status, body, provider, retryAfterMs) {
    const b = body as Record<string, any> | null;
    return failureFrom(status, b && typeof b.error === 'object' ? b.error : b, provider, retryAfterMs);
  },

  // An `error` event, such as the overloaded_error Anthropic sends after accepting a stream.
  streamError(event, provider) {
    const data = eventJson(event);
    if (event.event !== 'error' && data?.type !== 'error') return null;
    const error = data?.error ?? data;
    const message = typeof error?.message === 'string' ? error.message : 'error event';
    const overloaded = error?.type === 'overloaded_error';
    return new UpstreamFailure(overloaded ? 'overloaded' : 'http', provider, message, overloaded ? 529 : 502);
  },
};
