// What a provider bills for a call that its usage does not count, read from the request instead:
// a web search per Chat Completions call sending `web_search_options` (server-tools.ts), and each
// image of the prompt, where the catalog gives a per-image price (media.ts). Both are known before
// the call, so a stream is billed them however it ends.
import type { Usage } from '../../infrastructure/providers/formats';
import { imageCount } from './media';
import { searchesPerCall } from './server-tools';

export type CountedFromRequest = Pick<Usage, 'web_searches' | 'images'>;

/** What the request sent to an endpoint (`dropped`: what its translation left out) is billed beyond its usage. */
export function countedFromRequest(operation: string, body: Record<string, any>, dropped: readonly string[]): CountedFromRequest {
  const searches = searchesPerCall(operation, body, dropped);
  const images = imageCount(body);
  return { ...(searches && { web_searches: searches }), ...(images && { images }) };
}

/** The provider's usage with what the request counts: at least its searches, and its images. */
export function withCounted(usage: Usage, counted: CountedFromRequest): Usage {
  const searches = Math.max(usage.web_searches ?? 0, counted.web_searches ?? 0);
  return {
    ...usage,
    ...(searches && { web_searches: searches }),
    ...(counted.images && { images: counted.images }),
  };
}
