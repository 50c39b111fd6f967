// Tools the provider runs itself and bills per use, beyond tokens: web search (Anthropic's
// `web_search_…` tool, OpenAI's `web_search` / `web_search_preview` in the Responses API). How many a
// call may use is held for before it runs; how many it used comes back in the provider's usage.

/** Searches held for a web search tool that sets no `max_uses`. */
const DEFAULT_SEARCHES = 5;

const isWebSearch = (t: unknown) =>
  typeof (t as { type?: unknown })?.type === 'string' && (t as { type: string }).type.startsWith('web_search');

/** The most web searches the request's tools let the provider run. */
export function webSearchesAllowed(body: Record<string, any>): number {
  if (!Array.isArray(body.tools)) return 0;
  let n = 0;
  for (const t of body.tools) if (isWebSearch(t)) n += Number.isInteger(t.max_uses) && t.max_uses > 0 ? t.max_uses : DEFAULT_SEARCHES;
  return n;
}
