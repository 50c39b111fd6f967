import type { Usage } from '../../infrastructure/providers/formats';

/** USD amounts are rounded to 1e-10: float sums read as money, and a single cheap call still shows. */
export function roundUsd(n: number): number {
  return Math.round(n * 1e10) / 1e10;
}

/** What a provider charges for a prompt token written to its cache, unless the catalog says: Anthropic's 5-minute write, */
const CACHE_WRITE_OF_PROMPT = 1.25;
/** and its 1-hour write. */
const CACHE_WRITE_1H_OF_PROMPT = 2;

/**
 * USD for a call: tokens at the endpoint's per-million prices (prompt tokens read from or written
 * to the provider's cache at its cache prices, audio tokens at its audio prices), plus its
 * per-request price, its per-search price for each web search the provider ran, and its per-image
 * price for each image of the prompt.
 */
export function costOf(
  e: {
    entry: {
      pricing: {
        prompt: number;
        completion: number;
        request?: number;
        cache_read?: number;
        cache_write?: number;
        cache_write_1h?: number;
        web_search?: number;
        audio?: number;
        audio_completion?: number;
        image?: number;
      };
    };
  },
  usage: Usage,
): number {
  const p = e.entry.pricing;
  // Parts of the prompt, never more than it (a provider's counts are not trusted to add up).
  const read = Math.min(usage.cache_read_tokens ?? 0, usage.input_tokens);
  const write = Math.min(usage.cache_write_tokens ?? 0, usage.input_tokens - read);
  const hour = Math.min(usage.cache_write_1h_tokens ?? 0, write);
  const heard = Math.min(usage.audio_input_tokens ?? 0, usage.input_tokens - read - write);
  const spoken = Math.min(usage.audio_output_tokens ?? 0, usage.output_tokens);
  const prompt =
    (usage.input_tokens - read - write - heard) * p.prompt +
    heard * (p.audio ?? p.prompt) +
    read * (p.cache_read ?? p.prompt) +
    (write - hour) * (p.cache_write ?? CACHE_WRITE_OF_PROMPT * p.prompt) +
    hour * (p.cache_write_1h ?? CACHE_WRITE_1H_OF_PROMPT * p.prompt);
  const completion = (usage.output_tokens - spoken) * p.completion + spoken * (p.audio_completion ?? p.completion);
  const usd =
    (prompt + completion) / 1e6 + (p.request ?? 0) + (usage.web_searches ?? 0) * (p.web_search ?? 0) + (usage.images ?? 0) * (p.image ?? 0);
  return roundUsd(usd);
}
