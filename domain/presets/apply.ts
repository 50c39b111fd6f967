// Using a preset: `"model": "@preset/<slug>"`, `"model": "<model>@preset/<slug>"` or
// `"preset": "<slug>"` applies the preset's designated version. Request fields win over preset
// fields (a shallow merge), the preset's system prompt is prepended as the system message, and
// tools merge by identity: preset tools first, a request tool replacing the preset tool it names.
import type { KeptVersions } from './kept-versions';
import { BadRequestError } from '../../infrastructure/errors';
import type { Store } from '../../infrastructure/store';
import { getDesignatedVersion, type VersionView } from './store';
import { withFields } from '../../infrastructure/objects/with-fields';

type Body = Record<string, any>;
export type ApplyFormat = 'chat' | 'messages' | 'responses' | 'decision' | 'embeddings';

const PRESET_IN_MODEL = /^(?:(.*)@)?preset\/([A-Za-z0-9][A-Za-z0-9._~-]*)$/;

/** The preset a body names, and the model it names beside it (if any). */
export function presetReference(body: Body): { slug: string; model: string | null } | null {
  const m = typeof body.model === 'string' ? PRESET_IN_MODEL.exec(body.model.startsWith('@') ? body.model.slice(1) : body.model) : null;
  if (m) return { slug: m[2], model: m[1] || null };
  if (typeof body.preset === 'string' && body.preset) {
    return { slug: body.preset.replace(/^@?preset\//, ''), model: typeof body.model === 'string' && body.model ? body.model : null };
  }
  return null;
}

function toolId(t: Body): string {
  if (t?.type === 'function' && t.function?.name) return `function:${t.function.name}`;
  if (typeof t?.name === 'string') return `name:${t.name}`;
  return `type:${t?.type}`;
}

export function mergeTools(presetTools: Body[] | undefined, requestTools: Body[] | undefined): Body[] | undefined {
  if (!presetTools?.length) return requestTools;
  if (!requestTools?.length) return presetTools;
  const byId = new Map(requestTools.map((t) => [toolId(t), t]));
  const merged = presetTools.map((t) => byId.get(toolId(t)) ?? t);
  const presetIds = new Set(presetTools.map(toolId));
  return [...merged, ...requestTools.filter((t) => !presetIds.has(toolId(t)))];
}

const CAP_NAMES: Partial<Record<ApplyFormat, string>> = { chat: 'max_tokens', messages: 'max_tokens', responses: 'max_output_tokens' };

/** Finds a preset's designated version by slug, with its size (one workspace's; a batch chunk caches it). */
export type PresetLookup = (slug: string) => Promise<{ version: VersionView; chars: number }>;

export const presetLookup =
  (store: Store, workspaceId: string, kept?: KeptVersions): PresetLookup =>
  (slug) =>
    getDesignatedVersion(store, workspaceId, slug, kept);

/**
 * The body with the preset it names applied, or the body itself if it names none: how every
 * capability uses presets. `addedChars` is what the preset added to what goes upstream (its config
 * and system prompt; nothing for a decision, which takes only its model and provider preferences):
 * what the call may cost, and what the process spends on it, grow with it as with the body's own size.
 */
export async function withPreset(body: Body, format: ApplyFormat, lookup: PresetLookup): Promise<{ body: Body; addedChars: number }> {
  const ref = presetReference(body);
  if (!ref) return { body, addedChars: 0 };
  const { version, chars } = await lookup(ref.slug);
  const out = applyPreset(body, version, format);
  const fallbacks = (Array.isArray(out.models) && out.models.length) || (Array.isArray(out.fallbacks) && out.fallbacks.length);
  if (typeof out.model !== 'string' && !fallbacks) {
    throw new BadRequestError(`model: preset "${ref.slug}" names no model; give one as <model>@preset/${ref.slug}`);
  }
  return { body: out, addedChars: format === 'decision' ? 0 : chars };
}

function applyPreset(body: Body, version: VersionView, format: ApplyFormat): Body {
  const ref = presetReference(body);
  const { preset: _drop, ...request } = body;
  const model = ref?.model ?? version.config.model ?? (typeof body.preset === 'string' ? body.model : undefined);
  // A decision borrows only the preset's model and provider preferences: its other fields are a chat's.
  if (format === 'decision') return withFields(request, { model, provider: request.provider ?? version.config.provider });
  const out: Body = withFields(version.config, request);
  if (model === undefined) delete out.model;
  else out.model = model;
  // The preset keeps the output cap under the name its creating shape used; each format has its own.
  const cap = CAP_NAMES[format];
  if (cap) {
    const other = cap === 'max_tokens' ? 'max_output_tokens' : 'max_tokens';
    if (other in version.config && !(other in request)) {
      if (!(cap in request)) out[cap] = version.config[other];
      delete out[other];
    }
  }
  const tools = mergeTools(version.config.tools as Body[] | undefined, request.tools);
  if (tools) out.tools = tools;
  const system = version.system_prompt;
  if (system) {
    if (format === 'chat')
      out.messages = [{ role: 'system', content: system }, ...(Array.isArray(request.messages) ? request.messages : [])];
    if (format === 'messages') {
      const own =
        typeof request.system === 'string' ? [{ type: 'text', text: request.system }] : Array.isArray(request.system) ? request.system : [];
      out.system = own.length ? [{ type: 'text', text: system }, ...own] : system;
    }
    if (format === 'responses') out.instructions = request.instructions ? `${system}\n\n${request.instructions}` : system;
  }
  return out;
}
