// OpenAI Chat Completions ⇄ Anthropic Messages, requests and answers (streams: streams.ts).
// Conversation content (messages, parts, tools, tool calls and results) is carried or refused with
// a 400 naming the field; generation parameters the target cannot take are dropped and named in
// `dropped` (the answer's `x-gateway-dropped-params` header). The mapping is docs/translation.md.
import { BadRequestError } from '../../errors';

type Json = Record<string, any>;

/**
 * Structured output on Messages: a tool of this name whose input schema is the requested JSON
 * schema, and a tool choice that forces it; its input comes back as the answer's text.
 */
export const JSON_OUTPUT_TOOL = 'gateway_json_output';

/** Anthropic requires an output cap; a Chat Completions request may leave it out. */
const DEFAULT_MAX_TOKENS = 4096;

/** Thinking budgets for OpenAI's reasoning efforts, and back. */
const EFFORT_BUDGET: Record<string, number> = { minimal: 1024, low: 2048, medium: 8192, high: 16384 };
const effortOf = (budget: number) => (budget < 2048 ? 'low' : budget < 16384 ? 'medium' : 'high');

/** The Chat Completions fields the translation carries; any other is dropped and named. */
const CHAT_FIELDS = new Set([
  'messages',
  'max_tokens',
  'max_completion_tokens',
  'temperature',
  'top_p',
  'top_k',
  'stop',
  'user',
  'tools',
  'tool_choice',
  'parallel_tool_calls',
  'reasoning',
  'reasoning_effort',
  'n',
  'response_format',
]);

/** The Messages fields the translation carries; any other (top_k, service_tier, container, …) is dropped and named. */
const MESSAGES_FIELDS = new Set([
  'messages',
  'system',
  'max_tokens',
  'temperature',
  'top_p',
  'stop_sequences',
  'metadata',
  'tools',
  'tool_choice',
  'thinking',
]);

/** Names every field of `body` the translation does not carry, so that none is lost in silence. */
export function dropUnknown(body: Json, carried: Set<string>, dropped: string[]): void {
  for (const k of Object.keys(body)) if (body[k] !== undefined && !carried.has(k) && !dropped.includes(k)) dropped.push(k);
}

const STOP_TO_CHAT: Record<string, string> = {
  end_turn: 'stop',
  stop_sequence: 'stop',
  pause_turn: 'stop',
  max_tokens: 'length',
  model_context_window_exceeded: 'length',
  tool_use: 'tool_calls',
  refusal: 'content_filter',
};
const STOP_TO_MESSAGES: Record<string, string> = {
  stop: 'end_turn',
  length: 'max_tokens',
  tool_calls: 'tool_use',
  function_call: 'tool_use',
  content_filter: 'refusal',
};

export const chatStopReason = (reason: string | null | undefined): string | null => (reason ? (STOP_TO_CHAT[reason] ?? 'stop') : null);
export const messagesStopReason = (reason: string | null | undefined): string | null =>
  reason ? (STOP_TO_MESSAGES[reason] ?? 'end_turn') : null;

function refuse(field: string, what: string, target: string): never {
  throw new BadRequestError(`${field}: ${what} cannot be sent to a provider of the ${target} format`);
}

/** `value` when it is a JSON object; else a 400 naming the field (parts and tools are open-ended in the schemas). */
export function objectAt(value: unknown, field: string): Json {
  if (!value || typeof value !== 'object' || Array.isArray(value)) throw new BadRequestError(`${field}: must be an object`);
  return value as Json;
}

/** `value` as a list (absent: empty); else a 400 naming the field. */
function listAt(value: unknown, field: string): unknown[] {
  if (value === undefined || value === null) return [];
  if (!Array.isArray(value)) throw new BadRequestError(`${field}: must be an array`);
  return value;
}

function parseArguments(text: unknown, field: string): Json {
  if (text === undefined || text === null || text === '') return {};
  try {
    const v = JSON.parse(String(text));
    if (v && typeof v === 'object' && !Array.isArray(v)) return v;
  } catch {
    /* refused below */
  }
  throw new BadRequestError(`${field}: tool call arguments must be a JSON object`);
}

const DATA_URL = /^data:([^;,]+)(?:;[^,]*)?;base64,(.*)$/s;

// ---------------------------------------------------------------- Chat Completions → Messages

/** A Chat Completions content part as a Messages content block. */
function blockOfPart(part: Json, field: string): Json {
  const cache = part.cache_control ? { cache_control: part.cache_control } : {};
  switch (part.type) {
    case 'text':
      return { type: 'text', text: String(part.text ?? ''), ...cache };
    case 'image_url': {
      const url = String(part.image_url?.url ?? '');
      const data = DATA_URL.exec(url);
      const source = data ? { type: 'base64', media_type: data[1], data: data[2] } : { type: 'url', url };
      return { type: 'image', source, ...cache };
    }
    case 'file': {
      const data = DATA_URL.exec(String(part.file?.file_data ?? ''));
      if (!data || data[1] !== 'application/pdf') return refuse(field, 'a file other than a base64 PDF', 'anthropic');
      return { type: 'document', source: { type: 'base64', media_type: data[1], data: data[2] }, ...cache };
    }
    default:
      return refuse(`${field}.type`, `a "${part.type}" part`, 'anthropic');
  }
}

function blocksOf(content: unknown, field: string): Json[] {
  if (content === null || content === undefined) return [];
  if (typeof content === 'string') return content ? [{ type: 'text', text: content }] : [];
  if (!Array.isArray(content)) return refuse(field, 'content that is neither text nor parts', 'anthropic');
  return content.map((p, i) => blockOfPart(objectAt(p, `${field}[${i}]`), `${field}[${i}]`)).filter((b) => b.type !== 'text' || b.text);
}

/** Adds a turn, merging it into the previous one of the same role (tool results of one turn share a user turn). */
function pushTurn(turns: Json[], role: 'user' | 'assistant', blocks: Json[]): void {
  if (!blocks.length) return;
  const last = turns[turns.length - 1];
  if (last?.role === role) last.content.push(...blocks);
  else turns.push({ role, content: blocks });
}

function toolChoiceToMessages(choice: unknown, parallel: unknown): Json | undefined {
  let out: Json | undefined;
  if (choice === 'auto') out = { type: 'auto' };
  else if (choice === 'none') out = { type: 'none' };
  else if (choice === 'required') out = { type: 'any' };
  else if (choice && typeof choice === 'object') out = { type: 'tool', name: (choice as Json).function?.name };
  if (parallel === false) out = { ...(out ?? { type: 'auto' }), disable_parallel_tool_use: true };
  return out;
}

export function chatRequestToMessages(body: Json, dropped: string[]): Json {
  const system: Json[] = [];
  const turns: Json[] = [];
  (body.messages as Json[]).forEach((m, i) => {
    const field = `messages[${i}]`;
    switch (m.role) {
      case 'system':
      case 'developer':
        system.push(
          ...blocksOf(m.content, `${field}.content`).map((b) =>
            b.type === 'text' ? b : refuse(field, 'a non-text system part', 'anthropic'),
          ),
        );
        break;
      case 'user':
        pushTurn(turns, 'user', blocksOf(m.content, `${field}.content`));
        break;
      case 'assistant': {
        const blocks: Json[] = [];
        if (typeof m.reasoning === 'string' && m.reasoning)
          blocks.push({ type: 'thinking', thinking: m.reasoning, signature: m.reasoning_signature ?? '' });
        blocks.push(...blocksOf(m.content, `${field}.content`));
        if (typeof m.refusal === 'string' && m.refusal) blocks.push({ type: 'text', text: m.refusal });
        listAt(m.tool_calls, `${field}.tool_calls`).forEach((item, j) => {
          const tc = objectAt(item, `${field}.tool_calls[${j}]`);
          if (tc.type !== 'function') refuse(`${field}.tool_calls[${j}].type`, `a "${tc.type}" tool call`, 'anthropic');
          blocks.push({
            type: 'tool_use',
            id: tc.id,
            name: tc.function?.name,
            input: parseArguments(tc.function?.arguments, `${field}.tool_calls[${j}].function.arguments`),
          });
        });
        pushTurn(turns, 'assistant', blocks);
        break;
      }
      case 'tool': {
        const content = typeof m.content === 'string' ? m.content : blocksOf(m.content, `${field}.content`);
        pushTurn(turns, 'user', [{ type: 'tool_result', tool_use_id: m.tool_call_id, content }]);
        break;
      }
      default:
        refuse(`${field}.role`, `a "${m.role}" message`, 'anthropic');
    }
  });

  const out: Json = { messages: turns };
  if (system.length) out.system = system.some((b) => b.cache_control) ? system : system.map((b) => b.text).join('\n\n');
  out.max_tokens = body.max_completion_tokens ?? body.max_tokens ?? DEFAULT_MAX_TOKENS;
  if (body.temperature !== undefined) {
    // Messages takes 0 to 1, Chat Completions 0 to 2: a temperature above 1 cannot be expressed.
    if (body.temperature === null || body.temperature <= 1) out.temperature = body.temperature;
    else dropped.push('temperature');
  }
  if (body.top_p !== undefined) out.top_p = body.top_p;
  if (body.top_k !== undefined) out.top_k = body.top_k;
  if (body.stop !== undefined && body.stop !== null) out.stop_sequences = Array.isArray(body.stop) ? body.stop : [body.stop];
  if (typeof body.user === 'string') out.metadata = { user_id: body.user };
  if (Array.isArray(body.tools) && body.tools.length) {
    out.tools = body.tools.map((item: unknown, i: number) => {
      const t = objectAt(item, `tools[${i}]`);
      if (t.type !== 'function') refuse(`tools[${i}].type`, `a "${t.type}" tool`, 'anthropic');
      const f = objectAt(t.function, `tools[${i}].function`);
      return {
        name: f.name,
        ...(f.description !== undefined && { description: f.description }),
        input_schema: f.parameters ?? { type: 'object', properties: {} },
        ...(t.cache_control && { cache_control: t.cache_control }),
      };
    });
  }
  const choice = toolChoiceToMessages(body.tool_choice, body.parallel_tool_calls);
  if (choice) out.tool_choice = choice;
  const effort = body.reasoning?.effort ?? body.reasoning_effort;
  const budget = body.reasoning?.max_tokens ?? (effort ? EFFORT_BUDGET[effort] : undefined);
  if (budget && body.reasoning?.enabled !== false && effort !== 'none') {
    out.thinking = { type: 'enabled', budget_tokens: budget };
    if (out.max_tokens <= budget) out.max_tokens = budget + out.max_tokens; // the cap counts the thinking too
  }
  if (body.n !== undefined && body.n !== 1) refuse('n', 'more than one choice', 'anthropic');
  const format = body.response_format;
  if (format && format.type !== 'text') {
    if (out.tools?.length) refuse('response_format', 'a structured output format together with tools', 'anthropic');
    const schema = format.type === 'json_schema' ? (format.json_schema?.schema ?? { type: 'object' }) : { type: 'object' };
    out.tools = [{ name: JSON_OUTPUT_TOOL, description: "Give the answer as this tool's input.", input_schema: schema }];
    out.tool_choice = { type: 'tool', name: JSON_OUTPUT_TOOL };
    delete out.thinking; // a forced tool choice does not go with extended thinking
  }
  dropUnknown(body, CHAT_FIELDS, dropped);
  return out;
}

/** A Messages answer as a Chat Completions answer. */
export function messagesAnswerToChat(msg: Json): Json {
  let text = '';
  let reasoning = '';
  const toolCalls: Json[] = [];
  let structured = false;
  for (const block of msg.content ?? []) {
    if (block.type === 'text') text += block.text;
    else if (block.type === 'thinking') reasoning += block.thinking;
    else if (block.type === 'tool_use' && block.name === JSON_OUTPUT_TOOL) {
      text += JSON.stringify(block.input ?? {});
      structured = true;
    } else if (block.type === 'tool_use')
      toolCalls.push({ id: block.id, type: 'function', function: { name: block.name, arguments: JSON.stringify(block.input ?? {}) } });
  }
  const message: Json = { role: 'assistant', content: text || null };
  if (toolCalls.length) message.tool_calls = toolCalls;
  if (reasoning) message.reasoning = reasoning;
  if (msg.stop_reason === 'refusal') message.refusal = text || 'refused';
  return {
    id: msg.id,
    object: 'chat.completion',
    created: Math.floor(Date.now() / 1000),
    model: msg.model,
    choices: [
      {
        index: 0,
        message,
        logprobs: null,
        finish_reason: structured && msg.stop_reason === 'tool_use' ? 'stop' : (chatStopReason(msg.stop_reason) ?? 'stop'),
      },
    ],
    usage: chatUsageOf(msg.usage ?? {}),
  };
}

/**
 * Messages usage in Chat Completions terms: prompt tokens include those read from and written to the
 * cache; the written ones are named too (`cache_write_tokens`, as OpenRouter does), since they cost
 * more, and of them those written to the 1-hour cache (`cache_write_1h_tokens`, ours), which cost more still.
 */
export function chatUsageOf(u: Json): Json {
  const cached = u.cache_read_input_tokens ?? 0;
  const written = u.cache_creation_input_tokens ?? 0;
  const hour = u.cache_creation?.ephemeral_1h_input_tokens ?? 0;
  const prompt = (u.input_tokens ?? 0) + cached + written;
  const completion = u.output_tokens ?? 0;
  return {
    prompt_tokens: prompt,
    completion_tokens: completion,
    total_tokens: prompt + completion,
    prompt_tokens_details: {
      cached_tokens: cached,
      ...(written && { cache_write_tokens: written }),
      ...(hour && { cache_write_1h_tokens: hour }),
    },
  };
}

// ---------------------------------------------------------------- Messages → Chat Completions

/** A Messages content block as a Chat Completions part. */
function partOfBlock(block: Json, field: string): Json {
  switch (block.type) {
    case 'text':
      return { type: 'text', text: block.text };
    case 'image': {
      const s = block.source ?? {};
      if (s.type === 'base64') return { type: 'image_url', image_url: { url: `data:${s.media_type};base64,${s.data}` } };
      if (s.type === 'url') return { type: 'image_url', image_url: { url: s.url } };
      return refuse(`${field}.source.type`, `an image from "${s.type}"`, 'openai');
    }
    case 'document': {
      const s = block.source ?? {};
      if (s.type === 'base64' && s.media_type === 'application/pdf')
        return { type: 'file', file: { filename: 'document.pdf', file_data: `data:application/pdf;base64,${s.data}` } };
      if (s.type === 'text') return { type: 'text', text: s.data };
      return refuse(`${field}.source`, 'a document other than a base64 PDF or text', 'openai');
    }
    default:
      return refuse(`${field}.type`, `a "${block.type}" block`, 'openai');
  }
}

const textOnly = (parts: Json[]) => parts.every((p) => p.type === 'text');
const contentOf = (parts: Json[]) => (textOnly(parts) ? parts.map((p) => p.text).join('') : parts);

function toolResultText(content: unknown, field: string): string | Json[] {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  return contentOf(content.map((b, i) => partOfBlock(objectAt(b, `${field}[${i}]`), `${field}[${i}]`)));
}

export function messagesRequestToChat(body: Json, dropped: string[]): Json {
  const messages: Json[] = [];
  if (body.system !== undefined) {
    const system = typeof body.system === 'string' ? body.system : (body.system as Json[]).map((b) => b.text ?? '').join('\n\n');
    if (system) messages.push({ role: 'system', content: system });
  }
  (body.messages as Json[]).forEach((m, i) => {
    const field = `messages[${i}].content`;
    const blocks: Json[] =
      typeof m.content === 'string'
        ? [{ type: 'text', text: m.content }]
        : listAt(m.content, field).map((b, j) => objectAt(b, `${field}[${j}]`));
    if (m.role === 'user') {
      // Tool results become tool messages, which must come straight after the assistant's calls.
      const parts: Json[] = [];
      blocks.forEach((b, j) => {
        if (b.type === 'tool_result') {
          const content = toolResultText(b.content, `${field}[${j}].content`);
          messages.push({
            role: 'tool',
            tool_call_id: b.tool_use_id,
            content: b.is_error ? `Error: ${typeof content === 'string' ? content : JSON.stringify(content)}` : content,
          });
        } else parts.push(partOfBlock(b, `${field}[${j}]`));
      });
      if (parts.length) messages.push({ role: 'user', content: contentOf(parts) });
    } else {
      let text = '';
      let reasoning = '';
      const toolCalls: Json[] = [];
      blocks.forEach((b, j) => {
        if (b.type === 'text') text += b.text;
        else if (b.type === 'thinking') reasoning += b.thinking;
        else if (b.type === 'redacted_thinking') return;
        else if (b.type === 'tool_use')
          toolCalls.push({ id: b.id, type: 'function', function: { name: b.name, arguments: JSON.stringify(b.input ?? {}) } });
        else refuse(`${field}[${j}].type`, `a "${b.type}" block in an assistant turn`, 'openai');
      });
      const msg: Json = { role: 'assistant', content: text || null };
      if (toolCalls.length) msg.tool_calls = toolCalls;
      if (reasoning) msg.reasoning = reasoning;
      messages.push(msg);
    }
  });

  const out: Json = { messages, max_tokens: body.max_tokens };
  for (const k of ['temperature', 'top_p'] as const) if (body[k] !== undefined) out[k] = body[k];
  if (Array.isArray(body.stop_sequences) && body.stop_sequences.length) out.stop = body.stop_sequences;
  if (typeof body.metadata?.user_id === 'string') out.user = body.metadata.user_id;
  if (Array.isArray(body.tools) && body.tools.length) {
    out.tools = body.tools.map((item: unknown, i: number) => {
      const t = objectAt(item, `tools[${i}]`);
      if (t.type && t.type !== 'custom') refuse(`tools[${i}].type`, `a "${t.type}" server tool`, 'openai');
      return {
        type: 'function',
        function: { name: t.name, ...(t.description !== undefined && { description: t.description }), parameters: t.input_schema },
      };
    });
  }
  const tc = body.tool_choice;
  if (tc) {
    if (tc.type === 'auto') out.tool_choice = 'auto';
    else if (tc.type === 'any') out.tool_choice = 'required';
    else if (tc.type === 'none') out.tool_choice = 'none';
    else if (tc.type === 'tool') out.tool_choice = { type: 'function', function: { name: tc.name } };
    if (tc.disable_parallel_tool_use === true) out.parallel_tool_calls = false;
  }
  if (body.thinking?.type === 'enabled') out.reasoning_effort = effortOf(body.thinking.budget_tokens ?? 0);
  dropUnknown(body, MESSAGES_FIELDS, dropped);
  return out;
}

/** A Chat Completions answer as a Messages answer. */
export function chatAnswerToMessages(chat: Json): Json {
  const choice = chat.choices?.[0] ?? {};
  const m = choice.message ?? {};
  const content: Json[] = [];
  if (typeof m.reasoning === 'string' && m.reasoning) content.push({ type: 'thinking', thinking: m.reasoning, signature: '' });
  const text = typeof m.content === 'string' ? m.content : typeof m.refusal === 'string' ? m.refusal : '';
  if (text) content.push({ type: 'text', text });
  for (const tc of m.tool_calls ?? []) {
    let input: Json = {};
    try {
      input = JSON.parse(tc.function?.arguments || '{}');
    } catch {
      input = { _raw: tc.function?.arguments }; // the model's own malformed arguments, kept rather than lost
    }
    content.push({ type: 'tool_use', id: tc.id, name: tc.function?.name, input });
  }
  return {
    id: chat.id,
    type: 'message',
    role: 'assistant',
    model: chat.model,
    content,
    stop_reason: messagesStopReason(choice.finish_reason) ?? 'end_turn',
    stop_sequence: null,
    usage: messagesUsageOf(chat.usage ?? {}),
  };
}

/** Chat Completions usage in Messages terms: input tokens exclude the cached ones. */
export function messagesUsageOf(u: Json): Json {
  const cached = u.prompt_tokens_details?.cached_tokens ?? 0;
  return {
    input_tokens: Math.max(0, (u.prompt_tokens ?? 0) - cached),
    output_tokens: u.completion_tokens ?? 0,
    cache_read_input_tokens: cached,
    cache_creation_input_tokens: 0,
  };
}
