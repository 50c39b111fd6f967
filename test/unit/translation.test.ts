// Format translation as properties (fast-check): a request translated to the other format and back
// keeps every message, part, tool, tool call and tool result; an answer streamed in arbitrary
// pieces and translated event by event accumulates to the translation of the whole answer.
import { expect } from 'chai';
import fc from 'fast-check';
import type { EventSourceMessage } from 'eventsource-parser';
import {
  chatAnswerToMessages,
  chatRequestToMessages,
  messagesAnswerToChat,
  messagesRequestToChat,
} from '../../infrastructure/providers/translate/chat-messages';
import { chatToMessagesStream, messagesToChatStream } from '../../infrastructure/providers/translate/streams';
import { ChatCompletionRequest, MessagesRequest } from '../../domain/completions/schema';
import { BadRequestError } from '../../infrastructure/errors';
import { fromSchema } from '../fuzz/arbitraries';
import { compileBody } from '../../infrastructure/validation';

type Json = Record<string, any>;

const text = fc.string({ minLength: 1, maxLength: 12 }).filter((s) => s.trim().length > 0);
const name = fc.stringMatching(/^[a-z][a-z0-9_]{0,10}$/);
const args = fc.dictionary(name, fc.oneof(fc.integer(), text, fc.boolean()), { maxKeys: 3 });
const imageUrl = fc.oneof(
  fc.constant('data:image/png;base64,iVBORw0KGgo='),
  name.map((n) => `https://example.com/${n}.png`),
);
const part = fc.oneof(
  text.map((t) => ({ type: 'text', text: t })),
  imageUrl.map((url) => ({ type: 'image_url', image_url: { url } })),
);
const tool = fc.record({ name, description: text, properties: fc.dictionary(name, fc.constant({ type: 'string' }), { maxKeys: 2 }) });

/** A Chat Completions conversation as a client may send it: system first, then turns; every tool call answered. */
const chatRequest = fc
  .record({
    system: fc.option(text, { nil: undefined }),
    turns: fc.array(
      fc.record({
        user: fc.oneof(text, fc.array(part, { minLength: 1, maxLength: 3 })),
        reply: fc.option(text, { nil: undefined }),
        calls: fc.array(fc.record({ name, args, result: text }), { maxLength: 2 }),
      }),
      { minLength: 1, maxLength: 4 },
    ),
    tools: fc.array(tool, { maxLength: 2 }),
  })
  .map(({ system, turns, tools }) => {
    const messages: Json[] = system ? [{ role: 'system', content: system }] : [];
    let id = 0;
    for (const t of turns) {
      messages.push({ role: 'user', content: t.user });
      if (!t.reply && !t.calls.length) continue;
      const calls = t.calls.map((c) => ({ ...c, id: `call_${id++}` }));
      messages.push({
        role: 'assistant',
        content: t.reply ?? null,
        ...(calls.length && {
          tool_calls: calls.map((c) => ({ id: c.id, type: 'function', function: { name: c.name, arguments: JSON.stringify(c.args) } })),
        }),
      });
      for (const c of calls) messages.push({ role: 'tool', tool_call_id: c.id, content: c.result });
    }
    return {
      messages,
      max_tokens: 100,
      ...(tools.length && {
        tools: tools.map((t) => ({
          type: 'function',
          function: { name: t.name, description: t.description, parameters: { type: 'object', properties: t.properties } },
        })),
      }),
    };
  });

/** What a conversation says, whatever its format: turns of text, images, tool calls and tool results. */
function chatContent(body: Json): Json {
  const turns: Json[] = [];
  const push = (role: string, items: Json[]) => {
    const last = turns[turns.length - 1];
    if (last?.role === role) last.items.push(...items);
    else turns.push({ role, items });
  };
  const parts = (c: unknown): Json[] =>
    typeof c === 'string'
      ? [{ text: c }]
      : Array.isArray(c)
        ? c.map((p) => (p.type === 'text' ? { text: p.text } : { image: p.image_url.url }))
        : [];
  const system: string[] = [];
  for (const m of body.messages) {
    if (m.role === 'system') system.push(m.content);
    else if (m.role === 'user') push('user', parts(m.content));
    else if (m.role === 'tool') push('user', [{ result: m.tool_call_id, text: m.content }]);
    else
      push('assistant', [
        ...parts(m.content),
        ...(m.tool_calls ?? []).map((tc: Json) => ({ call: tc.id, name: tc.function.name, args: JSON.parse(tc.function.arguments) })),
      ]);
  }
  // Adjacent texts of one turn are one text however they were split.
  for (const t of turns)
    t.items = t.items.reduce((acc: Json[], x: Json) => {
      const last = acc[acc.length - 1];
      if (x.text !== undefined && x.result === undefined && last?.text !== undefined && last.result === undefined) last.text += x.text;
      else acc.push({ ...x });
      return acc;
    }, []);
  const tools = (body.tools ?? []).map((t: Json) => ({
    name: t.function.name,
    description: t.function.description,
    schema: t.function.parameters,
  }));
  return { system: system.join('\n\n'), turns, tools };
}

/** What a Messages conversation says: turns of text, images, tool uses and tool results, whatever blocks they came in. */
function messagesContent(body: Json): Json {
  const system = typeof body.system === 'string' ? body.system : (body.system ?? []).map((b: Json) => b.text).join('\n\n');
  const turns = (body.messages as Json[]).map((m) => {
    const blocks: Json[] = typeof m.content === 'string' ? [{ type: 'text', text: m.content }] : m.content;
    const items: Json[] = [];
    for (const b of blocks) {
      const last = items[items.length - 1];
      if (b.type === 'text' && last?.text !== undefined && last.result === undefined) last.text += b.text;
      else if (b.type === 'text') items.push({ text: b.text });
      else if (b.type === 'image') items.push({ image: b.source });
      else if (b.type === 'tool_use') items.push({ use: b.id, name: b.name, input: b.input });
      else if (b.type === 'tool_result') items.push({ result: b.tool_use_id, text: b.content });
      else items.push({ other: b });
    }
    return { role: m.role, items };
  });
  return { system, turns, tools: body.tools };
}

/** Chat Completions chunks for a whole answer, its text and arguments cut at the given points. */
function chatChunks(answer: Json, cuts: number[]): EventSourceMessage[] {
  const m = answer.choices[0].message;
  const base = { id: answer.id, object: 'chat.completion.chunk', created: 1, model: answer.model };
  const chunk = (delta: Json, finish: string | null = null) => ({
    data: JSON.stringify({ ...base, choices: [{ index: 0, delta, finish_reason: finish }] }),
  });
  const pieces = (s: string) => {
    const at = [...new Set(cuts.map((c) => c % (s.length + 1)))].sort((a, b) => a - b);
    return [0, ...at, s.length]
      .slice(1)
      .map((end, i, all) => s.slice(i ? all[i - 1] : 0, end))
      .filter(Boolean);
  };
  const out = [chunk({ role: 'assistant', content: '' })];
  for (const p of pieces(m.reasoning ?? '')) out.push(chunk({ reasoning: p }));
  for (const p of pieces(m.content ?? '')) out.push(chunk({ content: p }));
  (m.tool_calls ?? []).forEach((tc: Json, index: number) => {
    out.push(chunk({ tool_calls: [{ index, id: tc.id, type: 'function', function: { name: tc.function.name, arguments: '' } }] }));
    for (const p of pieces(tc.function.arguments)) out.push(chunk({ tool_calls: [{ index, function: { arguments: p } }] }));
  });
  out.push(chunk({}, answer.choices[0].finish_reason));
  out.push({ data: JSON.stringify({ ...base, choices: [], usage: answer.usage }) });
  out.push({ data: '[DONE]' });
  return out;
}

/** A Messages stream accumulated as the Anthropic SDK does. */
function accumulateMessages(events: EventSourceMessage[]): Json {
  let msg: Json = {};
  for (const e of events) {
    const d = JSON.parse(e.data);
    if (d.type === 'message_start') msg = { ...d.message, content: [] };
    else if (d.type === 'content_block_start') msg.content.push({ ...d.content_block });
    else if (d.type === 'content_block_delta') {
      const b = msg.content[d.index];
      if (d.delta.type === 'text_delta') b.text += d.delta.text;
      else if (d.delta.type === 'thinking_delta') b.thinking += d.delta.thinking;
      else if (d.delta.type === 'input_json_delta') b.json = (b.json ?? '') + d.delta.partial_json;
    } else if (d.type === 'content_block_stop') {
      const b = msg.content[d.index];
      if (b.type === 'tool_use') {
        b.input = JSON.parse(b.json || '{}');
        delete b.json;
      }
    } else if (d.type === 'message_delta') {
      msg.stop_reason = d.delta.stop_reason;
      msg.usage = { ...msg.usage, ...d.usage };
    }
  }
  return msg;
}

/** A Chat Completions stream accumulated as the OpenAI SDK does. */
function accumulateChat(events: EventSourceMessage[]): Json {
  const message: Json = { role: 'assistant', content: null };
  let finish: string | null = null;
  let usage: Json | null = null;
  for (const e of events) {
    if (e.data === '[DONE]') continue;
    const c = JSON.parse(e.data);
    if (c.usage) usage = c.usage;
    for (const ch of c.choices ?? []) {
      const d = ch.delta;
      if (d.content) message.content = (message.content ?? '') + d.content;
      if (d.reasoning) message.reasoning = (message.reasoning ?? '') + d.reasoning;
      for (const tc of d.tool_calls ?? []) {
        message.tool_calls ??= [];
        const t = (message.tool_calls[tc.index] ??= { id: tc.id, type: 'function', function: { name: tc.function?.name, arguments: '' } });
        t.function.arguments += tc.function?.arguments ?? '';
      }
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  return { message, finish, usage };
}

const chatAnswer = fc
  .record({
    reasoning: fc.option(text, { nil: undefined }),
    content: fc.option(text, { nil: undefined }),
    calls: fc.array(fc.record({ name, args }), { maxLength: 2 }),
    finish: fc.constantFrom('stop', 'length', 'tool_calls', 'content_filter'),
    usage: fc.record({ prompt_tokens: fc.nat(1000), completion_tokens: fc.nat(1000), cached: fc.nat(10) }),
  })
  .map((a) => ({
    id: 'chatcmpl-1',
    object: 'chat.completion',
    created: 1,
    model: 'm',
    choices: [
      {
        index: 0,
        finish_reason: a.finish,
        message: {
          role: 'assistant',
          content: a.content ?? null,
          ...(a.reasoning && { reasoning: a.reasoning }),
          ...(a.calls.length && {
            tool_calls: a.calls.map((c, i) => ({
              id: `call_${i}`,
              type: 'function',
              function: { name: c.name, arguments: JSON.stringify(c.args) },
            })),
          }),
        },
      },
    ],
    usage: {
      prompt_tokens: a.usage.prompt_tokens + a.usage.cached,
      completion_tokens: a.usage.completion_tokens,
      total_tokens: a.usage.prompt_tokens + a.usage.cached + a.usage.completion_tokens,
      prompt_tokens_details: { cached_tokens: a.usage.cached },
    },
  }));

describe('format translation (properties)', () => {
  it('Chat Completions → Messages → Chat Completions keeps every message, part, tool, tool call and tool result', () => {
    fc.assert(
      fc.property(chatRequest, (body) => {
        const dropped: string[] = [];
        const back = messagesRequestToChat(chatRequestToMessages(body, dropped), dropped);
        expect(chatContent(back)).to.deep.equal(chatContent(body));
        expect(dropped).to.deep.equal([]);
      }),
      { numRuns: 300 },
    );
  });

  it('Messages → Chat Completions → Messages keeps them too', () => {
    fc.assert(
      fc.property(chatRequest, (chat) => {
        const dropped: string[] = [];
        const messages = chatRequestToMessages(chat, dropped);
        const again = chatRequestToMessages(messagesRequestToChat(messages, dropped), dropped);
        // What the conversation says is the same, read on the Messages side (text blocks may be joined differently).
        expect(messagesContent(again)).to.deep.equal(messagesContent(messages));
        expect(dropped).to.deep.equal([]);
      }),
      { numRuns: 300 },
    );
  });

  it('any request its schema accepts is translated with every tool, call and result, or refused with a 400 naming the field', () => {
    const count = (items: Json[] | undefined, keep: (x: Json) => boolean) => (items ?? []).filter(keep).length;
    /** Generated from the schema, kept when the route's own validator accepts it (as the gateway would). */
    const valid = (schema: Json) => {
      const validate = compileBody(schema as never);
      return (fromSchema(schema) as fc.Arbitrary<Json>).filter((body) => {
        try {
          validate(body);
          return true;
        } catch {
          return false;
        }
      });
    };
    const blocks = (body: Json) => (body.messages ?? []).flatMap((m: Json) => (Array.isArray(m.content) ? m.content : []));
    const outcome = (translate: () => Json) => {
      try {
        return translate();
      } catch (err) {
        expect(err).to.be.instanceOf(BadRequestError);
        expect((err as Error).message).to.match(/^[\w.[\]]+: /); // names the field
        return null;
      }
    };
    fc.assert(
      fc.property(valid(ChatCompletionRequest), (body) => {
        const out = outcome(() => chatRequestToMessages(body, []));
        if (!out) return;
        const calls = (body.messages ?? []).flatMap((m: Json) => (m.role === 'assistant' ? (m.tool_calls ?? []) : []));
        expect(count(blocks(out), (b) => b.type === 'tool_use')).to.equal(calls.length);
        expect(count(blocks(out), (b) => b.type === 'tool_result')).to.equal(count(body.messages, (m) => m.role === 'tool'));
        expect(out.tools?.length ?? 0).to.equal(
          body.tools?.length ?? (body.response_format && body.response_format.type !== 'text' ? 1 : 0),
        );
      }),
      { numRuns: 300 },
    );
    fc.assert(
      fc.property(valid(MessagesRequest), (body) => {
        const out = outcome(() => messagesRequestToChat(body, []));
        if (!out) return;
        const uses = count(blocks(body), (b) => b.type === 'tool_use');
        expect((out.messages as Json[]).flatMap((m) => m.tool_calls ?? []).length).to.equal(uses);
        expect(count(out.messages, (m) => m.role === 'tool')).to.equal(count(blocks(body), (b) => b.type === 'tool_result'));
        expect(out.tools?.length ?? 0).to.equal(body.tools?.length ?? 0);
      }),
      { numRuns: 300 },
    );
  });

  it('a Chat Completions stream translated event by event accumulates to the translation of the whole answer', () => {
    fc.assert(
      fc.property(chatAnswer, fc.array(fc.nat(40), { maxLength: 5 }), (answer, cuts) => {
        const translate = chatToMessagesStream();
        const streamed = accumulateMessages(chatChunks(answer, cuts).flatMap(translate));
        const whole = chatAnswerToMessages(answer);
        expect(streamed.content).to.deep.equal(
          whole.content.map((b: Json) => (b.type === 'thinking' ? { ...b, signature: undefined } : b)).map(stripUndefined),
        );
        expect(streamed.stop_reason).to.equal(whole.stop_reason);
        expect(streamed.usage).to.include({ input_tokens: whole.usage.input_tokens, output_tokens: whole.usage.output_tokens });
      }),
      { numRuns: 300 },
    );
  });

  it('a Messages stream translated event by event accumulates to the translation of the whole answer', () => {
    fc.assert(
      fc.property(chatAnswer, fc.array(fc.nat(40), { maxLength: 5 }), (chat, cuts) => {
        // A Messages answer and its stream: the Chat Completions ones, translated (checked above).
        const answer = chatAnswerToMessages(chat);
        const events = chatChunks(chat, cuts).flatMap(chatToMessagesStream());
        const streamed = accumulateChat(events.flatMap(messagesToChatStream()));
        const whole = messagesAnswerToChat(answer);
        expect(streamed.message.content).to.equal(whole.choices[0].message.content);
        expect(streamed.message.reasoning).to.equal(whole.choices[0].message.reasoning);
        expect(streamed.message.tool_calls).to.deep.equal(whole.choices[0].message.tool_calls);
        expect(streamed.finish).to.equal(whole.choices[0].finish_reason);
        expect(streamed.usage).to.deep.equal(whole.usage);
      }),
      { numRuns: 300 },
    );
  });
});

function stripUndefined(b: Json): Json {
  return Object.fromEntries(Object.entries(b).filter(([, v]) => v !== undefined));
}
