// Tools the provider runs itself and bills per use, beyond tokens: web search (Anthropic's
// `web_search_…` tool, OpenAI's `web_search` / `web_search_preview` in the Responses API, and
// `web_search_options` on a Chat Completions call to OpenAI's search models, billed one search per
// call). How many a call may use is held for before it runs; how many it used comes back in the
// provider's usage, or is the one per call. Such a call goes only to endpoints the catalog gives a
// search price (domain/routing/engine.ts); other such tools have no price in the catalog, so they
// are refused rather than given away.
import { BadRequestError } from '../../infrastructure/errors';

/** Searches held for a web search tool that sets no `max_uses` (and the cap the web plugin sets on Anthropic's). */
export const DEFAULT_SEARCHES = 5;

/** A provider's own web search tool, in any format. */
export const isWebSearch = (t: unknown) =>
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

/** `web_search_options` set on a call: an object (null and absent ask for no search). */
const asksSearchOptions = (body: Record<string, any>) => typeof body.web_search_options === 'object' && body.web_search_options !== null;

/** The most web searches the request lets the provider run: its tools', and the one of `web_search_options`. */
export function webSearchesAllowed(body: Record<string, any>): number {
  let n = asksSearchOptions(body) ? 1 : 0;
  if (Array.isArray(body.tools))
    for (const t of body.tools) if (isWebSearch(t)) n += Number.isInteger(t.max_uses) && t.max_uses > 0 ? t.max_uses : DEFAULT_SEARCHES;
  return n;
}

/** The request field that lets the provider search (for a 400 naming it), when one does. */
export function searchField(body: Record<string, any>): string | null {
  if (asksSearchOptions(body)) return 'web_search_options';
  const i = Array.isArray(body.tools) ? body.tools.findIndex(isWebSearch) : -1;
  return i < 0 ? null : `tools[${i}]`;
}

/**
 * The web searches a provider bills for a call whatever its answer reports: one for a Chat
 * Completions call that sent `web_search_options` (OpenAI bills its search models per call, and
 * its usage does not count them). A translation that dropped the field sent no search.
 */
export function searchesPerCall(operation: string, body: Record<string, any>, dropped: readonly string[]): number {
  return operation === 'chat' && asksSearchOptions(body) && !dropped.includes('web_search_options') ? 1 : 0;
}
