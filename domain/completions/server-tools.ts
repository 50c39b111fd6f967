// Tools the provider runs itself and bills per use, beyond tokens: web search (Anthropic's
// `web_search_…` tool, OpenAI's `web_search` / `web_search_preview` in the Responses API). How many a
// call may use is held for before it runs; how many it used comes back in the provider's usage.
// Other such tools have no price in the catalog, so they are refused rather than given away.
import { BadRequestError } from '../../infrastructure/errors';

/** Searches held for a web search tool that sets no `max_uses`. */
const DEFAULT_SEARCHES = 5;

const isWebSearch = (t: unknown) =>
  typeof (t as { type?: unknown })?.type === 'string' && (t as { type: string }).type.startsWith('web_search');

/**
 * Tools a provider runs and bills by use, beyond the call's tokens, at prices the catalog does not
 * give: OpenAI's code interpreter (a container each), file search (per 1,000 calls) and image
 * generation (image tokens), and Anthropic's code execution (container hours).
 */
const UNPRICED_TOOLS = ['code_interpreter', 'file_search', 'image_generation', 'code_execution'];

/** A 400 for the first tool of the request the provider would run at a price the gateway does not bill. */
export function refuseUnpricedTools(body: Record<string, any>): void {
  if (!Array.isArray(body.tools)) return;
  body.tools.forEach((t: unknown, i: number) => {
    const type = (t as { type?: unknown })?.type;
    if (typeof type === 'string' && UNPRICED_TOOLS.some((u) => type.startsWith(u)))
      throw new BadRequestError(
        `tools[${i}].type: "${type}" runs on the provider at a price the catalog does not give, which this gateway does not bill`,
      );
  });
}

/** The most web searches the request's tools let the provider run. */
export function webSearchesAllowed(body: Record<string, any>): number {
  if (!Array.isArray(body.tools)) return 0;
  let n = 0;
  for (const t of body.tools) if (isWebSearch(t)) n += Number.isInteger(t.max_uses) && t.max_uses > 0 ? t.max_uses : DEFAULT_SEARCHES;
  return n;
}
