// OpenRouter's plugins. The web plugin (`plugins: [{id: "web"}]`, or a model id ending `:online`)
// runs as the provider's own web search: OpenRouter's "native" engine. It becomes the search
// setting of the call's own format before routing, so it is held for, routed (only endpoints with a
// search price) and billed as a search the client asked for itself; the other engines are search
// services this gateway does not run, so asking for one is a 400 rather than a call answered
// without a search. The other plugins (which a preset may store) are not run; an answer names them.
import { BadRequestError } from '../../infrastructure/errors';
import type { ModelVariant } from '../catalog';
import type { InferenceOperation } from './formats';
import { DEFAULT_SEARCHES, isWebSearch } from './server-tools';

type Body = Record<string, any>;

/**
 * The plugins a call names, turned on, that this gateway does not run (`plugins.<id>`), and the
 * transforms it names (`transforms.<name>`: OpenRouter's older form of context compression), for
 * the answer's dropped-parameters header.
 */
export function pluginsNotRun(body: Body): string[] {
  const plugins: Body[] = Array.isArray(body.plugins) ? body.plugins : [];
  const transforms: unknown[] = Array.isArray(body.transforms) ? body.transforms : [];
  return [
    ...plugins.filter((p) => typeof p?.id === 'string' && p.id !== 'web' && p.enabled !== false).map((p) => `plugins.${p.id}`),
    ...transforms.filter((t): t is string => typeof t === 'string').map((t) => `transforms.${t}`),
  ];
}

/** The call's web plugin turned on, and where it is named (`plugins[i]`, or `model` for `:online`); null without one. */
function webPlugin(body: Body, variant: ModelVariant): { plugin: Body; field: string } | null {
  const plugins: unknown[] = Array.isArray(body.plugins) ? body.plugins : [];
  const at = plugins.findIndex((p) => (p as Body)?.id === 'web');
  const plugin = at >= 0 ? (plugins[at] as Body) : variant === 'online' ? {} : null;
  if (!plugin || plugin.enabled === false) return null;
  return { plugin, field: at >= 0 ? `plugins[${at}]` : 'model' };
}

/** Where the call turns its web plugin on (for a 400 about its search), or null. */
export function webPluginField(body: Body, variant: ModelVariant): string | null {
  return webPlugin(body, variant)?.field ?? null;
}

/** The body with its web plugin (or `:online`) turned into the format's own search setting; the body itself when it has none. */
export function withWebPlugin(body: Body, operation: InferenceOperation, variant: ModelVariant): Body {
  const found = webPlugin(body, variant);
  if (!found) return body;
  const { plugin, field } = found;
  if (plugin.engine !== undefined && plugin.engine !== 'native') {
    throw new BadRequestError(
      `${field}.engine: "${plugin.engine}" is a search service this gateway does not run; web search runs as the provider's own (engine "native")`,
    );
  }
  const allowed = Array.isArray(plugin.include_domains) ? plugin.include_domains : undefined;
  const blocked = Array.isArray(plugin.exclude_domains) ? plugin.exclude_domains : undefined;
  const tools: unknown[] = Array.isArray(body.tools) ? body.tools : [];
  switch (operation) {
    case 'chat':
      return body.web_search_options ? body : { ...body, web_search_options: {} };
    case 'responses':
      if (tools.some(isWebSearch)) return body;
      return { ...body, tools: [...tools, { type: 'web_search', ...(allowed && { filters: { allowed_domains: allowed } }) }] };
    case 'messages':
      if (tools.some(isWebSearch)) return body;
      return {
        ...body,
        tools: [
          ...tools,
          {
            type: 'web_search_20250305',
            name: 'web_search',
            max_uses: plugin.max_uses ?? DEFAULT_SEARCHES,
            ...(allowed ? { allowed_domains: allowed } : blocked && { blocked_domains: blocked }),
          },
        ],
      };
    default:
      throw new BadRequestError(`${field}: web search is for chat, messages and responses calls`);
  }
}
