// Streams translated event by event between OpenAI Chat Completions chunks and Anthropic Messages
// events. Each translator is a small state machine made per stream: it takes one upstream event and
// gives the events (none, one or several) the client's format has for it, so that the client's
// own stream helpers accumulate the same answer the non-streamed translation gives.
import type { EventSourceMessage } from 'eventsource-parser';
import { jsonObject } from '../formats/format';
import { chatStopReason, chatUsageOf, JSON_OUTPUT_TOOL, messagesStopReason, messagesUsageOf } from './chat-messages';
import { withFields } from '../../objects/with-fields';

type Json = Record<string, any>;

/** One upstream event in, the client's events out. */
export type StreamTranslator = (event: EventSourceMessage) => EventSourceMessage[];

const typed = (type: string, body: Json): EventSourceMessage => ({ event: type, data: JSON.stringify({ type, ...body }) });
const bare = (body: Json | '[DONE]'): EventSourceMessage => ({ data: body === '[DONE]' ? body : JSON.stringify(body) });

/** Anthropic Messages events → OpenAI Chat Completions chunks. */
export function messagesToChatStream(): StreamTranslator {
  let base: Json = {};
  let usage: Json = {};
  let finish: string | null = null;
  /** Chat tool-call index of each content block that is a tool use. */
  const toolIndex = new Map<number, number>();
  /** Content blocks that carry structured output: their JSON is the answer's text. */
  const structured = new Set<number>();
  const chunk = (delta: Json, finishReason: string | null = null) =>
    bare(withFields(base, { choices: [{ index: 0, delta, logprobs: null, finish_reason: finishReason }] }));

  return (event) => {
    const data = jsonObject(event.data);
    if (!data) return [];
    switch (event.event ?? data.type) {
      case 'message_start': {
        const m = data.message ?? {};
        base = { id: m.id, object: 'chat.completion.chunk', created: Math.floor(Date.now() / 1000), model: m.model };
        usage = { ...m.usage };
        return [chunk({ role: 'assistant', content: '' })];
      }
      case 'content_block_start': {
        const b = data.content_block ?? {};
        if (b.type === 'tool_use' && b.name === JSON_OUTPUT_TOOL) {
          structured.add(data.index);
          return [];
        }
        if (b.type === 'tool_use') {
          const index = toolIndex.size;
          toolIndex.set(data.index, index);
          return [chunk({ tool_calls: [{ index, id: b.id, type: 'function', function: { name: b.name, arguments: '' } }] })];
        }
        if (b.type === 'text' && b.text) return [chunk({ content: b.text })];
        return [];
      }
      case 'content_block_delta': {
        const d = data.delta ?? {};
        if (d.type === 'text_delta') return [chunk({ content: d.text })];
        if (d.type === 'thinking_delta') return [chunk({ reasoning: d.thinking })];
        if (d.type === 'input_json_delta' && structured.has(data.index)) return d.partial_json ? [chunk({ content: d.partial_json })] : [];
        if (d.type === 'input_json_delta' && toolIndex.has(data.index))
          return [chunk({ tool_calls: [{ index: toolIndex.get(data.index), function: { arguments: d.partial_json } }] })];
        return [];
      }
      case 'message_delta':
        finish = structured.size && data.delta?.stop_reason === 'tool_use' ? 'stop' : (chatStopReason(data.delta?.stop_reason) ?? finish);
        usage = { ...usage, ...Object.fromEntries(Object.entries(data.usage ?? {}).filter(([, v]) => v !== null)) };
        return [];
      case 'message_stop':
        // The finish, then the usage chunk (passed on only to a client that asked), then the end.
        return [chunk({}, finish ?? 'stop'), bare(withFields(base, { choices: [], usage: chatUsageOf(usage) })), bare('[DONE]')];
      case 'error':
        return [
          bare({ ...base, error: { message: data.error?.message ?? 'upstream error', type: data.error?.type, code: 502 }, choices: [] }),
        ];
      default:
        return []; // ping, content_block_stop
    }
  };
}

/** OpenAI Chat Completions chunks → Anthropic Messages events. */
export function chatToMessagesStream(): StreamTranslator {
  let started = false;
  let id = '';
  let model = '';
  /** The open content block: its index and kind (a tool call's chat index for tool blocks). */
  let open: { index: number; kind: 'text' | 'thinking' | 'tool'; tool?: number } | null = null;
  let next = 0;
  let stop: string | null = null;
  let usage: Json | null = null;

  const close = (): EventSourceMessage[] => {
    if (!open) return [];
    const index = open.index;
    open = null;
    return [typed('content_block_stop', { index })];
  };
  const openBlock = (kind: 'text' | 'thinking' | 'tool', block: Json, tool?: number): EventSourceMessage[] => {
    const out = close();
    open = { index: next++, kind, tool };
    out.push(typed('content_block_start', { index: open.index, content_block: block }));
    return out;
  };
  const start = (): EventSourceMessage[] => {
    if (started) return [];
    started = true;
    const message = {
      id,
      type: 'message',
      role: 'assistant',
      model,
      content: [],
      stop_reason: null,
      stop_sequence: null,
      usage: { input_tokens: 0, output_tokens: 0 },
    };
    return [typed('message_start', { message })];
  };
  const finish = (): EventSourceMessage[] => {
    const u = messagesUsageOf(usage ?? {});
    return [
      ...start(),
      ...close(),
      typed('message_delta', { delta: { stop_reason: stop ?? 'end_turn', stop_sequence: null }, usage: u }),
      typed('message_stop', {}),
    ];
  };

  return (event) => {
    if (event.data.trim() === '[DONE]') return finish();
    const c = jsonObject(event.data);
    if (!c) return [];
    if (c.error) {
      const type = c.error.code === 529 || c.error.type === 'overloaded_error' ? 'overloaded_error' : 'api_error';
      return [typed('error', { error: { type, message: String(c.error.message ?? 'upstream error') } })];
    }
    id ||= c.id ?? '';
    model ||= c.model ?? '';
    const out = start();
    if (c.usage) usage = c.usage;
    for (const choice of c.choices ?? []) {
      const d = choice.delta ?? {};
      if (typeof d.reasoning === 'string' && d.reasoning) {
        if (open?.kind !== 'thinking') out.push(...openBlock('thinking', { type: 'thinking', thinking: '' }));
        out.push(typed('content_block_delta', { index: open!.index, delta: { type: 'thinking_delta', thinking: d.reasoning } }));
      }
      const text = typeof d.content === 'string' ? d.content : typeof d.refusal === 'string' ? d.refusal : '';
      if (text) {
        if (open?.kind !== 'text') out.push(...openBlock('text', { type: 'text', text: '' }));
        out.push(typed('content_block_delta', { index: open!.index, delta: { type: 'text_delta', text } }));
      }
      for (const tc of d.tool_calls ?? []) {
        if (open?.kind !== 'tool' || open.tool !== tc.index)
          out.push(...openBlock('tool', { type: 'tool_use', id: tc.id, name: tc.function?.name, input: {} }, tc.index));
        if (tc.function?.arguments)
          out.push(
            typed('content_block_delta', { index: open!.index, delta: { type: 'input_json_delta', partial_json: tc.function.arguments } }),
          );
      }
      if (choice.finish_reason) stop = messagesStopReason(choice.finish_reason);
    }
    return out;
  };
}
