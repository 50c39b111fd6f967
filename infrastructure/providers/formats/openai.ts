// OpenAI-compatible providers: Chat Completions, Responses and Embeddings, bearer-token auth.
import type { ProviderFormat } from './format';
import { eventJson, failureFrom, tokens } from './format';
import { UpstreamFailure } from '../failure';
import { withFields } from '../../objects/with-fields';

export const openai: ProviderFormat = {
  paths: { chat: '/chat/completions', responses: '/responses', embeddings: '/embeddings' },

  headers: (apiKey): Record<string, string> => (apiKey ? { authorization: `Bearer ${apiKey}` } : {}),

  // Priority processing (about twice the standard price) and flex processing (about half, slower).
  tiers: { priority: { service_tier: 'priority' }, flex: { service_tier: 'flex' } },

  // Chat completions report usage in a stream only when asked: the gateway always asks, since it
  // bills from it, and passes the usage on to the client only if it asked too.
  streamBody(operation, body) {
    const out: Record<string, unknown> = withFields(body, { stream: true });
    if (operation === 'chat') out.stream_options = { ...(body.stream_options as object | undefined), include_usage: true };
    return out;
  },

  // Cached prompt tokens are counted in the prompt's and reported apart, priced at the endpoint's
  // cache_read price when the catalog gives one.
  usageOf(operation, body) {
    const u = body?.usage ?? {};
    if (operation === 'embeddings') return { input_tokens: tokens(u.prompt_tokens ?? u.total_tokens), output_tokens: 0 };
    const chat = operation === 'chat';
    const details = (chat ? u.prompt_tokens_details : u.input_tokens_details) ?? {};
    const cached = tokens(details.cached_tokens);
    // Written to a cache (and of that, to the 1-hour cache): what an Anthropic provider's answer,
    // translated to this format, says it wrote.
    const written = tokens(details.cache_write_tokens);
    const hour = Math.min(written, tokens(details.cache_write_1h_tokens));
    // A Responses answer lists each web search it ran among its output items.
    const searches =
      !chat && Array.isArray(body.output) ? body.output.filter((o: { type?: string }) => o?.type === 'web_search_call').length : 0;
    // Audio heard and spoken by a chat call, counted in its prompt and completion tokens and reported apart.
    const audioIn = chat ? tokens(details.audio_tokens) : 0;
    const audioOut = chat ? tokens(u.completion_tokens_details?.audio_tokens) : 0;
    return {
      input_tokens: tokens(chat ? u.prompt_tokens : u.input_tokens),
      output_tokens: tokens(chat ? u.completion_tokens : u.output_tokens),
      ...(cached && { cache_read_tokens: cached }),
      ...(written && { cache_write_tokens: written }),
      ...(hour && { cache_write_1h_tokens: hour }),
      ...(searches && { web_searches: searches }),
      ...(audioIn && { audio_input_tokens: audioIn }),
      ...(audioOut && { audio_output_tokens: audioOut }),
    };
  },

  failureOf(status, body, provider, retryAfterMs) {
    const b = body as Record<string, any> | null;
    const error = b && typeof b.error === 'object' ? b.error : b;
    return failureFrom(status, error, provider, retryAfterMs, typeof b?.detail === 'string' ? b.detail : undefined);
  },

  // A chat chunk or Responses event carrying `error`, or a Responses `error` event.
  streamError(event, provider) {
    const data = eventJson(event);
    const error = event.event === 'error' ? (data?.error ?? data) : data?.error;
    if (!error || typeof error !== 'object') return null;
    const message = typeof error.message === 'string' ? error.message : 'error event';
    const overloaded = error.type === 'overloaded_error' || error.code === 529;
    return new UpstreamFailure(overloaded ? 'overloaded' : 'http', provider, message, overloaded ? 529 : 502);
  },
};
