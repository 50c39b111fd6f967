// The sandbox's streamed answers: a complete answer (the same one a non-streamed call gets) cut into
// the server-sent events of its wire format, one event per word of output, as real providers send
// about one token per event. Events are made as they are written, so a stream its reader has
// stopped reading holds its answer and a position, not every event (120 such streams of 150,000
// words held 3.4 GB and a core of garbage collection when they were made up front).
type Json = Record<string, any>;

export interface SseEvent {
  /** The `event:` field; null for OpenAI chat, which sends bare `data:` lines. */
  event: string | null;
  data: string;
  /** Whether this event carries a piece of output (what `fail_after` counts). */
  content: boolean;
}

/** The words of `text`, each but the first with the space before it. */
function* words(text: string): Generator<string> {
  if (!text) return;
  for (let at = 0, end = text.indexOf(' '); ; at = end, end = text.indexOf(' ', at + 1)) {
    yield text.slice(at, end === -1 ? text.length : end);
    if (end === -1) return;
  }
}

/** A tool call's arguments as the pieces a provider streams them in. */
const pieces = (json: string) => json.match(/.{1,8}/gs) ?? [];

function* chat(full: Json, request: Json): Generator<SseEvent> {
  const base = { id: full.id, object: 'chat.completion.chunk', created: full.created, model: full.model };
  const chunk = (delta: Json, finish: string | null, content = false): SseEvent => ({
    event: null,
    data: JSON.stringify({ ...base, choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }] }),
    content,
  });
  const message = full.choices[0].message;
  yield chunk({ role: 'assistant', content: '' }, null);
  for (const w of words(message.reasoning ?? '')) yield chunk({ reasoning: w }, null, true);
  for (const w of words(message.content ?? '')) yield chunk({ content: w }, null, true);
  for (const w of words(message.audio?.transcript ?? '')) yield chunk({ audio: { transcript: w } }, null, true);
  for (const w of words(message.refusal ?? '')) yield chunk({ refusal: w }, null, true);
  for (const [index, tc] of (message.tool_calls ?? []).entries()) {
    yield chunk({ tool_calls: [{ index, id: tc.id, type: 'function', function: { name: tc.function.name, arguments: '' } }] }, null);
    for (const p of pieces(tc.function.arguments)) yield chunk({ tool_calls: [{ index, function: { arguments: p } }] }, null, true);
  }
  yield chunk({}, full.choices[0].finish_reason);
  if (request.stream_options?.include_usage) {
    yield { event: null, data: JSON.stringify({ ...base, choices: [], usage: full.usage }), content: false };
  }
  yield { event: null, data: '[DONE]', content: false };
}

function* messages(full: Json): Generator<SseEvent> {
  const ev = (type: string, body: Json, content = false): SseEvent => ({ event: type, data: JSON.stringify({ type, ...body }), content });
  yield ev('message_start', {
    message: {
      ...full,
      content: [],
      stop_reason: null,
      stop_sequence: null,
      usage: { ...full.usage, output_tokens: 1 },
    },
  });
  yield ev('ping', {});
  for (const [index, block] of (full.content as Json[]).entries()) {
    const delta = (d: Json) => ev('content_block_delta', { index, delta: d }, true);
    if (block.type === 'thinking') {
      yield ev('content_block_start', { index, content_block: { type: 'thinking', thinking: '', signature: '' } });
      for (const w of words(block.thinking)) yield delta({ type: 'thinking_delta', thinking: w });
      yield ev('content_block_delta', { index, delta: { type: 'signature_delta', signature: block.signature } });
    } else if (block.type === 'tool_use') {
      yield ev('content_block_start', { index, content_block: { ...block, input: {} } });
      for (const p of pieces(JSON.stringify(block.input))) yield delta({ type: 'input_json_delta', partial_json: p });
    } else {
      yield ev('content_block_start', { index, content_block: { type: 'text', text: '' } });
      for (const w of words(block.text)) yield delta({ type: 'text_delta', text: w });
    }
    yield ev('content_block_stop', { index });
  }
  yield ev('message_delta', {
    delta: { stop_reason: full.stop_reason, stop_sequence: full.stop_sequence },
    usage: { output_tokens: full.usage.output_tokens },
  });
  yield ev('message_stop', {});
}

function* responses(full: Json): Generator<SseEvent> {
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
  yield ev('response.created', { response: pending });
  yield ev('response.in_progress', { response: pending });
  yield ev('response.output_item.added', { output_index: 0, item: { ...item, status: 'in_progress', content: [] } });
  yield ev('response.content_part.added', { ...ids, part: { type: 'output_text', text: '', annotations: [] } });
  for (const w of words(text)) yield ev('response.output_text.delta', { ...ids, delta: w }, true);
  yield ev('response.output_text.done', { ...ids, text });
  yield ev('response.content_part.done', { ...ids, part: item.content[0] });
  yield ev('response.output_item.done', { output_index: 0, item });
  yield ev('response.completed', { response: full });
}

export const STREAMERS: Record<string, (full: Json, request: Json) => Iterable<SseEvent>> = {
  '/openai/v1/chat/completions': chat,
  '/anthropic/v1/messages': messages,
  '/openai/v1/responses': responses,
};

export function encodeEvent(e: SseEvent): string {
  return `${e.event ? `event: ${e.event}\n` : ''}data: ${e.data}\n\n`;
}
