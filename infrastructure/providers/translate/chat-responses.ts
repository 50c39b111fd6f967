// OpenAI Responses → Chat Completions requests, and Chat Completions answers and streams → Responses:
// how a Responses call reaches a provider that speaks only Messages (through Chat Completions,
// index.ts). Same rules as chat-messages.ts: content is carried or refused with a 400 naming the
// field; parameters that cannot be expressed are dropped and named.
import type { EventSourceMessage } from 'eventsource-parser';
import { BadRequestError } from '../../errors';
import type { StreamTranslator } from './streams';
import { dropUnknown, objectAt } from './chat-messages';

type Json = Record<string, any>;

/** The Responses fields the translation carries; any other (include, store, truncation, …) is dropped and named. */
const RESPONSES_FIELDS = new Set([
  'input',
  'instructions',
  'previous_response_id',
  'max_output_tokens',
  'temperature',
  'top_p',
  'parallel_tool_calls',
  'user',
  'tools',
  'tool_choice',
  'text',
  'reasoning',
]);

function refuse(field: string, what: string): never {
  throw new BadRequestError(`${field}: ${what} cannot be sent through Chat Completions (the route to this provider)`);
}

function partOf(part: Json, field: string): Json {
  switch (part.type) {
    case 'input_text':
    case 'output_text':
    case 'text':
      return { type: 'text', text: part.text };
    case 'input_image':
      if (typeof part.image_url !== 'string') return refuse(`${field}.image_url`, 'an image by file id');
      return { type: 'image_url', image_url: { url: part.image_url, ...(part.detail && { detail: part.detail }) } };
    case 'input_file':
      if (typeof part.file_data !== 'string') return refuse(`${field}.file_data`, 'a file by id or URL');
      return { type: 'file', file: { filename: part.filename ?? 'file', file_data: part.file_data } };
    case 'refusal':
      return { type: 'text', text: part.refusal };
    default:
      return refuse(`${field}.type`, `a "${part.type}" part`);
  }
}

function contentOf(content: unknown, field: string): string | Json[] {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return refuse(field, 'content that is neither text nor parts');
  const parts = content.map((p, i) => partOf(objectAt(p, `${field}[${i}]`), `${field}[${i}]`));
  return parts.every((p) => p.type === 'text') ? parts.map((p) => p.text).join('') : parts;
}

export function responsesRequestToChat(body: Json, dropped: string[]): Json {
  const messages: Json[] = [];
  if (typeof body.instructions === 'string' && body.instructions) messages.push({ role: 'system', content: body.instructions });
  const items: Json[] = typeof body.input === 'string' ? [{ role: 'user', content: body.input }] : body.input;
  /** The assistant turn being built from consecutive function calls (and reasoning). */
  let assistant: Json | null = null;
  items.forEach((entry, i) => {
    const field = `input[${i}]`;
    const item = objectAt(entry, field);
    const type = item.type ?? 'message';
    if (type === 'function_call') {
      if (!assistant) messages.push((assistant = { role: 'assistant', content: null, tool_calls: [] }));
      (assistant.tool_calls ??= []).push({
        id: item.call_id,
        type: 'function',
        function: { name: item.name, arguments: item.arguments ?? '{}' },
      });
      return;
    }
    if (type === 'reasoning') {
      const text = (item.summary ?? []).map((s: Json) => s.text).join('');
      if (!assistant) messages.push((assistant = { role: 'assistant', content: null }));
      assistant.reasoning = (assistant.reasoning ?? '') + text;
      return;
    }
    assistant = null;
    if (type === 'function_call_output') {
      const output = typeof item.output === 'string' ? item.output : contentOf(item.output, `${field}.output`);
      messages.push({ role: 'tool', tool_call_id: item.call_id, content: output });
    } else if (type === 'message') {
      const content = contentOf(item.content, `${field}.content`);
      if (item.role === 'assistant') messages.push((assistant = { role: 'assistant', content: content || null }));
      else if (['user', 'system', 'developer'].includes(item.role)) messages.push({ role: item.role, content });
      else refuse(`${field}.role`, `a "${item.role}" message`);
    } else {
      refuse(`${field}.type`, `a "${type}" item`);
    }
  });

  const out: Json = { messages };
  if (body.max_output_tokens !== undefined) out.max_tokens = body.max_output_tokens;
  for (const k of ['temperature', 'top_p', 'parallel_tool_calls', 'user'] as const) if (body[k] !== undefined) out[k] = body[k];
  if (Array.isArray(body.tools) && body.tools.length) {
    out.tools = body.tools.map((entry: unknown, i: number) => {
      const t = objectAt(entry, `tools[${i}]`);
      if (t.type !== 'function') refuse(`tools[${i}].type`, `a "${t.type}" tool`);
      const fn = { name: t.name, parameters: t.parameters, ...(t.description !== undefined && { description: t.description }) };
      return { type: 'function', function: { ...fn, ...(t.strict !== undefined && { strict: t.strict }) } };
    });
  }
  const tc = body.tool_choice;
  if (typeof tc === 'string') out.tool_choice = tc;
  else if (tc?.type === 'function') out.tool_choice = { type: 'function', function: { name: tc.name } };
  else if (tc) refuse('tool_choice', `a "${tc.type}" tool choice`);
  const format = body.text?.format;
  if (format?.type === 'json_schema')
    out.response_format = { type: 'json_schema', json_schema: { name: format.name, schema: format.schema, strict: format.strict } };
  else if (format?.type === 'json_object') out.response_format = { type: 'json_object' };
  if (body.reasoning?.effort) out.reasoning_effort = body.reasoning.effort;
  dropUnknown(body, RESPONSES_FIELDS, dropped);
  return out;
}

const usageOf = (u: Json) => ({
  input_tokens: u.prompt_tokens ?? 0,
  output_tokens: u.completion_tokens ?? 0,
  total_tokens: (u.prompt_tokens ?? 0) + (u.completion_tokens ?? 0),
  input_tokens_details: { cached_tokens: u.prompt_tokens_details?.cached_tokens ?? 0 },
  output_tokens_details: { reasoning_tokens: u.completion_tokens_details?.reasoning_tokens ?? 0 },
});

/** How a finish reason ends a response: completed, or incomplete and why. */
function ending(finish: string | null): { status: string; incomplete_details: Json | null } {
  if (finish === 'length') return { status: 'incomplete', incomplete_details: { reason: 'max_output_tokens' } };
  if (finish === 'content_filter') return { status: 'incomplete', incomplete_details: { reason: 'content_filter' } };
  return { status: 'completed', incomplete_details: null };
}

interface Output {
  reasoning: string;
  text: string;
  refusal: string;
  calls: { id: string; name: string; arguments: string }[];
}

/** The output items of a response, in the order a Responses model gives them. */
function outputItems(id: string, o: Output): Json[] {
  const items: Json[] = [];
  if (o.reasoning) items.push({ type: 'reasoning', id: `rs_${id}`, summary: [{ type: 'summary_text', text: o.reasoning }] });
  if (o.text || o.refusal) {
    const content = o.refusal ? [{ type: 'refusal', refusal: o.refusal }] : [{ type: 'output_text', text: o.text, annotations: [] }];
    items.push({ type: 'message', id: `msg_${id}`, status: 'completed', role: 'assistant', content });
  }
  for (const [i, c] of o.calls.entries())
    items.push({ type: 'function_call', id: `fc_${id}_${i}`, call_id: c.id, name: c.name, arguments: c.arguments, status: 'completed' });
  return items;
}

function responseOf(chat: Json, output: Json[], finish: string | null, usage: Json | null): Json {
  return {
    id: chat.id,
    object: 'response',
    created_at: chat.created ?? Math.floor(Date.now() / 1000),
    model: chat.model,
    ...ending(finish),
    error: null,
    output,
    usage: usage && usageOf(usage),
  };
}

/** A Chat Completions answer as a Responses answer. */
export function chatAnswerToResponses(chat: Json): Json {
  const choice = chat.choices?.[0] ?? {};
  const m = choice.message ?? {};
  const calls = (m.tool_calls ?? []).map((tc: Json) => ({ id: tc.id, name: tc.function?.name, arguments: tc.function?.arguments ?? '{}' }));
  const output = outputItems(String(chat.id), { reasoning: m.reasoning ?? '', text: m.content ?? '', refusal: m.refusal ?? '', calls });
  return responseOf(chat, output, choice.finish_reason ?? 'stop', chat.usage ?? {});
}

/** Chat Completions chunks → Responses events (numbered), ending with the whole response. */
export function chatToResponsesStream(): StreamTranslator {
  let seq = 0;
  let head: Json | null = null;
  const o: Output = { reasoning: '', text: '', refusal: '', calls: [] };
  let finish: string | null = null;
  let usage: Json | null = null;
  /** The item being streamed: its kind, output index and (tool calls) chat index. */
  let open: { kind: 'reasoning' | 'message' | 'call'; index: number; tool?: number } | null = null;
  let items = 0;
  const ev = (type: string, body: Json): EventSourceMessage => ({
    event: type,
    data: JSON.stringify({ type, sequence_number: seq++, ...body }),
  });
  const id = () => String(head?.id ?? '');

  const close = (): EventSourceMessage[] => {
    if (!open) return [];
    const index = open.index;
    const out: EventSourceMessage[] = [];
    if (open.kind === 'reasoning') {
      const item = outputItems(id(), { ...o, text: '', refusal: '', calls: [] })[0];
      out.push(ev('response.reasoning_summary_text.done', { item_id: item.id, output_index: index, summary_index: 0, text: o.reasoning }));
      out.push(ev('response.output_item.done', { output_index: index, item }));
    } else if (open.kind === 'message') {
      const item = outputItems(id(), { reasoning: '', text: o.text, refusal: o.refusal, calls: [] })[0];
      const part = item.content[0];
      if (part.type === 'output_text')
        out.push(ev('response.output_text.done', { item_id: item.id, output_index: index, content_index: 0, text: o.text }));
      out.push(ev('response.content_part.done', { item_id: item.id, output_index: index, content_index: 0, part }));
      out.push(ev('response.output_item.done', { output_index: index, item }));
    } else {
      const call = o.calls[open.tool!];
      const item = {
        type: 'function_call',
        id: `fc_${id()}_${open.tool}`,
        call_id: call.id,
        name: call.name,
        arguments: call.arguments,
        status: 'completed',
      };
      out.push(ev('response.function_call_arguments.done', { item_id: item.id, output_index: index, arguments: call.arguments }));
      out.push(ev('response.output_item.done', { output_index: index, item }));
    }
    open = null;
    return out;
  };

  return (event) => {
    if (event.data.trim() === '[DONE]') {
      const out = close();
      const response = responseOf(head ?? {}, outputItems(id(), o), finish ?? 'stop', usage);
      out.push(ev(response.status === 'completed' ? 'response.completed' : 'response.incomplete', { response }));
      return out;
    }
    let c: Json;
    try {
      c = JSON.parse(event.data);
    } catch {
      return [];
    }
    if (c.error) return [ev('error', { code: 'server_error', message: String(c.error.message ?? 'upstream error'), param: null })];
    const out: EventSourceMessage[] = [];
    if (!head) {
      head = { id: c.id, model: c.model, created: c.created };
      const response = { ...responseOf(head, [], null, null), status: 'in_progress' };
      out.push(ev('response.created', { response }), ev('response.in_progress', { response }));
    }
    if (c.usage) usage = c.usage;
    for (const choice of c.choices ?? []) {
      const d = choice.delta ?? {};
      if (typeof d.reasoning === 'string' && d.reasoning) {
        if (open?.kind !== 'reasoning') {
          out.push(...close());
          open = { kind: 'reasoning', index: items++ };
          const item = { type: 'reasoning', id: `rs_${id()}`, summary: [] };
          out.push(ev('response.output_item.added', { output_index: open.index, item }));
          out.push(
            ev('response.reasoning_summary_part.added', {
              item_id: item.id,
              output_index: open.index,
              summary_index: 0,
              part: { type: 'summary_text', text: '' },
            }),
          );
        }
        o.reasoning += d.reasoning;
        out.push(
          ev('response.reasoning_summary_text.delta', {
            item_id: `rs_${id()}`,
            output_index: open!.index,
            summary_index: 0,
            delta: d.reasoning,
          }),
        );
      }
      const refusal = typeof d.refusal === 'string' ? d.refusal : '';
      const text = typeof d.content === 'string' ? d.content : '';
      if (text || refusal) {
        if (open?.kind !== 'message') {
          out.push(...close());
          open = { kind: 'message', index: items++ };
          const item = { type: 'message', id: `msg_${id()}`, status: 'in_progress', role: 'assistant', content: [] };
          out.push(ev('response.output_item.added', { output_index: open.index, item }));
          const part = refusal ? { type: 'refusal', refusal: '' } : { type: 'output_text', text: '', annotations: [] };
          out.push(ev('response.content_part.added', { item_id: item.id, output_index: open.index, content_index: 0, part }));
        }
        const at = (delta: string) => ({ item_id: `msg_${id()}`, output_index: open!.index, content_index: 0, delta });
        if (text) {
          o.text += text;
          out.push(ev('response.output_text.delta', at(text)));
        } else {
          o.refusal += refusal;
          out.push(ev('response.refusal.delta', at(refusal)));
        }
      }
      for (const tc of d.tool_calls ?? []) {
        if (open?.kind !== 'call' || open.tool !== tc.index) {
          out.push(...close());
          o.calls[tc.index] = { id: tc.id, name: tc.function?.name, arguments: '' };
          open = { kind: 'call', index: items++, tool: tc.index };
          const item = {
            type: 'function_call',
            id: `fc_${id()}_${tc.index}`,
            call_id: tc.id,
            name: tc.function?.name,
            arguments: '',
            status: 'in_progress',
          };
          out.push(ev('response.output_item.added', { output_index: open.index, item }));
        }
        const piece = tc.function?.arguments ?? '';
        if (piece) {
          o.calls[tc.index].arguments += piece;
          out.push(
            ev('response.function_call_arguments.delta', { item_id: `fc_${id()}_${tc.index}`, output_index: open!.index, delta: piece }),
          );
        }
      }
      if (choice.finish_reason) finish = choice.finish_reason;
    }
    return out;
  };
}
