// The sandbox's streamed answers: a complete answer (the same one a non-streamed call gets) cut into
// the server-sent events of its wire format, one event per word of output, as real providers send
// about one token per event.
type Json = Record<string, any>;

export interface SseEvent {
  /** The `event:` field; null for OpenAI chat, which sends bare `data:` lines. */
  event: string | null;
  data: string;
  /** Whether this event carries a piece of output (what `fail_after` counts). */
  content: boolean;
}

const words = (text: string) => (text ? text.split(' ').map((w, i) => (i === 0 ? w : ` ${w}`)) : []);

/** A tool call's arguments as the pieces a provider streams them in. */
const pieces = (json: string) => json.match(/.{1,8}/gs) ?? [];

function chat(full: Json, request: Json): SseEvent[] {
  const base = { id: full.id, object: 'chat.completion.chunk', created: full.created, model: full.model };
  const chunk = (delta: Json, finish: string | null, content = false): SseEvent => ({
    event: null,
    data: JSON.stringify({ ...base, choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }] }),
    content,
  });
  const message = full.choices[0].message;
  const out = [chunk({ role: 'assistant', content: '' }, null)];
  for (const w of words(message.reasoning ?? '')) out.push(chunk({ reasoning: w }, null, true));
  for (const w of words(message.content ?? '')) out.push(chunk({ content: w }, null, true));
  for (const w of words(message.refusal ?? '')) out.push(chunk({ refusal: w }, null, true));
  for (const [index, tc] of (message.tool_calls ?? []).entries()) {
    out.push(chunk({ tool_calls: [{ index, id: tc.id, type: 'function', function: { name: tc.function.name, arguments: '' } }] }, null));
    for (const p of pieces(tc.function.arguments)) out.push(chunk({ tool_calls: [{ index, function: { arguments: p } }] }, null, true));
  }
  out.push(chunk({}, full.choices[0].finish_reason));
  if (request.stream_options?.include_usage) {
    out.push({ event: null, data: JSON.stringify({ ...base, choices: [], usage: full.usage }), content: false });
  }
  out.push({ event: null, data: '[DONE]', content: false });
  return out;
}

function messages(full: Json): SseEvent[] {
  const ev = (type: string, body: Json, content = false): SseEvent => ({ event: type, data: JSON.stringify({ type, ...body }), content });
  const out = [
    ev('message_start', {
      message: {
        ...full,
        content: [],
        stop_reason: null,
        stop_sequence: null,
        usage: { input_tokens: full.usage.input_tokens, output_tokens: 1 },
      },
    }),
    ev('ping', {}),
  ];
  for (const [index, block] of (full.content as Json[]).entries()) {
    const delta = (d: Json) => ev('content_block_delta', { index, delta: d }, true);
    if (block.type === 'thinking') {
      out.push(ev('content_block_start', { index, content_block: { type: 'thinking', thinking: '', signature: '' } }));
      out.push(...words(block.thinking).map((w) => delta({ type: 'thinking_delta', thinking: w })));
      out.push(ev('content_block_delta', { index, delta: { type: 'signature_delta', signature: block.signature } }));
    } else if (block.type === 'tool_use') {
      out.push(ev('content_block_start', { index, content_block: { ...block, input: {} } }));
      out.push(...pieces(JSON.stringify(block.input)).map((p) => delta({ type: 'input_json_delta', partial_json: p })));
    } else {
      out.push(ev('content_block_start', { index, content_block: { type: 'text', text: '' } }));
      out.push(...words(block.text).map((w) => delta({ type: 'text_delta', text: w })));
    }
    out.push(ev('content_block_stop', { index }));
  }
  out.push(
    ev('message_delta', {
      delta: { stop_reason: full.stop_reason, stop_sequence: full.stop_sequence },
      usage: { output_tokens: full.usage.output_tokens },
    }),
    ev('message_stop', {}),
  );
  return out;
}

function responses(full: Json): SseEvent[] {
  let seq = 0;
  const ev = (type: string, body: Json, content = false): SseEvent => ({
    event: type,
    data: JSON.stringify({ type, sequence_number: seq++, ...body }),
    content,
  });
  const item = full.output[0];
  const text = item.content[0].text as string;
  const pending = { ...full, status: 'in_progress', output: [], usage: null };
  const ids = { item_id: item.id, output_index: 0, content_index: 0 };
  return [
    ev('response.created', { response: pending }),
    ev('response.in_progress', { response: pending }),
    ev('response.output_item.added', { output_index: 0, item: { ...item, status: 'in_progress', content: [] } }),
    ev('response.content_part.added', { ...ids, part: { type: 'output_text', text: '', annotations: [] } }),
    ...words(text).map((w) => ev('response.output_text.delta', { ...ids, delta: w }, true)),
    ev('response.output_text.done', { ...ids, text }),
    ev('response.content_part.done', { ...ids, part: item.content[0] }),
    ev('response.output_item.done', { output_index: 0, item }),
    ev('response.completed', { response: full }),
  ];
}

export const STREAMERS: Record<string, (full: Json, request: Json) => SseEvent[]> = {
  '/openai/v1/chat/completions': chat,
  '/anthropic/v1/messages': messages,
  '/openai/v1/responses': responses,
};

export function encodeEvent(e: SseEvent): string {
  return `${e.event ? `event: ${e.event}\n` : ''}data: ${e.data}\n\n`;
}
