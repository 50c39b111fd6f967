// Anthropic Messages providers: `x-api-key` auth with a pinned API version, typed stream events.
import type { ProviderFormat, Usage } from './format';
import { eventJson, failureFrom, tokens } from './format';
import { UpstreamFailure } from '../failure';
import { withFields } from '../../objects/with-fields';

export const anthropic: ProviderFormat = {
  paths: { messages: '/v1/messages' },

  headers: (apiKey) => ({ 'anthropic-version': '2023-06-01', ...(apiKey ? { 'x-api-key': apiKey } : {}) }),
  // Fast mode: two to six times the standard price.
  tiers: { fast: { speed: 'fast' } },

  streamBody: (_operation, body) => withFields(body, { stream: true }),

  // Anthropic's input_tokens leave out what was read from or written to the prompt cache, which it
  // bills apart (reads at a tenth of the prompt price, writes at 1.25 times it, or 2 for its 1-hour cache).
  usageOf(_operation, body) {
    return anthropicUsage(body?.usage ?? {});
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

/** An Anthropic usage object as the gateway bills it: every prompt token in input_tokens, the cached ones also apart. */
export function anthropicUsage(u: Record<string, any>): Usage {
  const read = tokens(u.cache_read_input_tokens);
  const write = tokens(u.cache_creation_input_tokens);
  const hour = Math.min(write, tokens(u.cache_creation?.ephemeral_1h_input_tokens));
  const searches = tokens(u.server_tool_use?.web_search_requests);
  return {
    input_tokens: tokens(u.input_tokens) + read + write,
    output_tokens: tokens(u.output_tokens),
    ...(read && { cache_read_tokens: read }),
    ...(write && { cache_write_tokens: write }),
    ...(hour && { cache_write_1h_tokens: hour }),
    ...(searches && { web_searches: searches }),
  };
}
