// The overlap rule: of an inference body, only the keys that belong to a preset's configuration
// are stored; per-request fields (messages, input, prompt, stream, session_id, user, trace,
// metadata …) and unknown fields are dropped. The system prompt is kept apart as `system_prompt`.

export type PresetFormat = 'messages' | 'chat' | 'responses';

/** The configuration keys each format stores (documented in docs/presets.md). */
export const CONFIG_KEYS: Record<PresetFormat, readonly string[]> = {
  messages: [
    'model',
    'models',
    'fallbacks',
    'provider',
    'max_tokens',
    'temperature',
    'top_p',
    'top_k',
    'stop_sequences',
    'tools',
    'tool_choice',
    'thinking',
    'output_config',
    'plugins',
    'cache_control',
    'context_management',
    'service_tier',
    'speed',
    'stop_server_tools_when',
    'safeguards',
  ],
  chat: [
    'model',
    'models',
    'provider',
    'max_tokens',
    'max_completion_tokens',
    'temperature',
    'top_p',
    'top_k',
    'min_p',
    'top_a',
    'frequency_penalty',
    'presence_penalty',
    'repetition_penalty',
    'seed',
    'stop',
    'logit_bias',
    'logprobs',
    'top_logprobs',
    'response_format',
    'tools',
    'tool_choice',
    'parallel_tool_calls',
    'reasoning',
    'reasoning_effort',
    'plugins',
    'modalities',
    'service_tier',
    'verbosity',
  ],
  responses: [
    'model',
    'models',
    'provider',
    'max_output_tokens',
    'temperature',
    'top_p',
    'tools',
    'tool_choice',
    'parallel_tool_calls',
    'reasoning',
    'text',
    'plugins',
    'max_tool_calls',
    'truncation',
    'service_tier',
  ],
};

type Body = Record<string, unknown>;

function textOf(content: unknown): string {
  if (typeof content === 'string') return content;
  if (Array.isArray(content))
    return content
      .map((b) => (b && typeof b === 'object' && typeof (b as Body).text === 'string' ? ((b as Body).text as string) : ''))
      .filter(Boolean)
      .join('\n');
  return '';
}

/** The system prompt a body carries: `system` (messages), system/developer messages (chat), `instructions` (responses). */
export function systemPromptOf(format: PresetFormat, body: Body): string | null {
  if (format === 'messages') return body.system === undefined ? null : textOf(body.system);
  if (format === 'responses') return typeof body.instructions === 'string' ? body.instructions : null;
  const parts = (Array.isArray(body.messages) ? body.messages : [])
    .filter((m: Body) => m?.role === 'system' || m?.role === 'developer')
    .map((m: Body) => textOf(m.content));
  return parts.length ? parts.join('\n\n') : null;
}

/**
 * The stored configuration. The deprecated `route` alias becomes the provider sort partition it
 * stands for (`fallback` → `model`, `sort` → `none`), unless `provider.sort.partition` is given.
 */
export function configOf(format: PresetFormat, body: Body): Body {
  const config: Body = {};
  for (const key of CONFIG_KEYS[format]) if (body[key] !== undefined) config[key] = body[key];
  if (body.route === 'fallback' || body.route === 'sort') {
    const provider = { ...((config.provider as Body | null) ?? {}) };
    const sort = provider.sort;
    const sortObject: Body = typeof sort === 'string' ? { by: sort } : { ...((sort as Body | null) ?? {}) };
    if (sortObject.partition == null) sortObject.partition = body.route === 'fallback' ? 'model' : 'none';
    provider.sort = sortObject;
    config.provider = provider;
  }
  return config;
}
