// What the sandbox answers, decided once for every chat format: a request is read into a neutral
// view (its last turn, tools, images, limits), and the outcome (text, a tool call, reasoning, and
// why it stopped) is rendered by each format. Deterministic: the same request, the same outcome.
// Triggers, so every mapping can be tested end to end:
//   tools given (and tool_choice not none), last turn not a tool result → a call of the named or
//   first tool, its arguments made from the tool's JSON schema                 → tool_calls / tool_use
//   the last turn a tool result → text that quotes the result                   → stop / end_turn
//   a stop sequence that is a word of the text → the text cut before it         → stop / stop_sequence
//   an output cap below the answer's length → the text cut at the cap           → length / max_tokens
//   "[refuse]" in the last user text → a refusal                                → content_filter / refusal
//   images in the conversation → the text begins "I see <n> image(s)."
//   reasoning asked for (reasoning_effort, reasoning, thinking) → a few words of reasoning first
import { sentence } from './generate';

type Json = Record<string, any>;

export interface ConversationView {
  lastUserText: string;
  /** The last turn is a tool's result: its text. */
  toolResult: string | null;
  images: number;
  tools: { name: string; schema: Json | undefined }[];
  /** 'none', 'auto', 'required', or the name of the tool that must be called. */
  toolChoice: string;
  stops: string[];
  maxTokens: number;
  reasoning: boolean;
}

export type StopKind = 'end' | 'length' | 'stop_sequence' | 'tool' | 'refusal';

export interface Outcome {
  text: string;
  reasoning: string | null;
  toolCall: { id: string; name: string; arguments: Json } | null;
  stop: StopKind;
  stopSequence: string | null;
}

/** Arguments that satisfy a (simple) JSON schema: a value per property, chosen by the seed. */
function valueFor(schema: Json | undefined, rand: () => number, depth = 0): unknown {
  const s = schema ?? {};
  if (Array.isArray(s.enum) && s.enum.length) return s.enum[Math.floor(rand() * s.enum.length)];
  const type = Array.isArray(s.type) ? s.type[0] : s.type;
  switch (type) {
    case 'integer':
      return Math.floor(rand() * 100);
    case 'number':
      return Math.round(rand() * 10000) / 100;
    case 'boolean':
      return rand() < 0.5;
    case 'array':
      return depth > 3 ? [] : [valueFor(s.items, rand, depth + 1)];
    case 'object':
      if (depth > 3) return {};
      return Object.fromEntries(Object.entries<Json>(s.properties ?? {}).map(([k, v]) => [k, valueFor(v, rand, depth + 1)]));
    default:
      return sentence(rand, 2);
  }
}

export function decide(view: ConversationView, rand: () => number, maxWords: number, hash: string): Outcome {
  const none: Outcome = { text: '', reasoning: null, toolCall: null, stop: 'end', stopSequence: null };
  if (view.lastUserText.includes('[refuse]') && !view.toolResult) return { ...none, text: "I can't help with that.", stop: 'refusal' };
  const reasoning = view.reasoning ? sentence(rand, 5) : null;
  const callable = view.tools.length && view.toolChoice !== 'none' && !view.toolResult;
  if (callable) {
    const tool = view.tools.find((t) => t.name === view.toolChoice) ?? view.tools[0];
    const args = valueFor(tool.schema ?? { type: 'object' }, rand) as Json;
    return { ...none, reasoning, toolCall: { id: `call_${hash.slice(0, 20)}`, name: tool.name, arguments: args }, stop: 'tool' };
  }
  const prefix: string[] = [];
  if (view.images) prefix.push(`I see ${view.images} image${view.images === 1 ? '' : 's'}.`);
  if (view.toolResult !== null) prefix.push(`The tool said: ${view.toolResult.slice(0, 40)}.`);
  const wanted = Math.max(1, maxWords);
  const words = [...prefix.join(' ').split(' ').filter(Boolean), ...sentence(rand, wanted).split(' ')];
  for (let i = 0; i < words.length; i++) {
    const stop = view.stops.find((s) => s && words[i] === s);
    if (stop !== undefined && i < view.maxTokens)
      return { ...none, reasoning, text: words.slice(0, i).join(' '), stop: 'stop_sequence', stopSequence: stop };
  }
  if (words.length > view.maxTokens)
    return { ...none, reasoning, text: words.slice(0, Math.max(1, view.maxTokens)).join(' '), stop: 'length' };
  return { ...none, reasoning, text: words.join(' ') };
}

const partsOf = (content: unknown): Json[] => (Array.isArray(content) ? content : []);
const textOfParts = (content: unknown): string =>
  typeof content === 'string'
    ? content
    : partsOf(content)
        .map((p) => (typeof p.text === 'string' ? p.text : typeof p.content === 'string' ? p.content : ''))
        .join(' ');

/** A Chat Completions request's view. */
export function chatView(body: Json): ConversationView {
  const messages: Json[] = body.messages;
  const last = messages[messages.length - 1];
  const lastUser = [...messages].reverse().find((m) => m.role === 'user');
  const choice = body.tool_choice;
  return {
    lastUserText: textOfParts(lastUser?.content ?? ''),
    toolResult: last?.role === 'tool' ? textOfParts(last.content) : null,
    images: messages.reduce((n, m) => n + partsOf(m.content).filter((p) => p.type === 'image_url').length, 0),
    tools: (body.tools ?? []).map((t: Json) => ({ name: t.function?.name, schema: t.function?.parameters })),
    toolChoice: typeof choice === 'string' ? choice : (choice?.function?.name ?? 'auto'),
    stops: body.stop === undefined || body.stop === null ? [] : Array.isArray(body.stop) ? body.stop : [body.stop],
    maxTokens: Number(body.max_completion_tokens ?? body.max_tokens ?? 16), // the sandbox's own default cap
    reasoning: Boolean(body.reasoning_effort || body.reasoning),
  };
}

/** A tool the provider runs itself (web search), billed per use: each such tool is used once here. */
export const isServerTool = (t: Json): boolean => typeof t?.type === 'string' && t.type.startsWith('web_search');

/** An Anthropic Messages request's view. */
export function messagesView(body: Json): ConversationView {
  const messages: Json[] = body.messages;
  const last = messages[messages.length - 1];
  const lastBlocks = partsOf(last?.content);
  const result = last?.role === 'user' ? lastBlocks.find((b) => b.type === 'tool_result') : undefined;
  const lastUser = [...messages].reverse().find((m) => m.role === 'user' && !partsOf(m.content).some((b) => b.type === 'tool_result'));
  const choice = body.tool_choice;
  return {
    lastUserText: textOfParts(lastUser?.content ?? ''),
    toolResult: result ? textOfParts(result.content) : null,
    images: messages.reduce((n, m) => n + partsOf(m.content).filter((b) => b.type === 'image').length, 0),
    // Server tools (web search) are run by the provider, not called by the model's answer.
    tools: (body.tools ?? []).filter((t: Json) => !isServerTool(t)).map((t: Json) => ({ name: t.name, schema: t.input_schema })),
    toolChoice: !choice ? 'auto' : choice.type === 'tool' ? choice.name : choice.type === 'any' ? 'required' : choice.type,
    stops: Array.isArray(body.stop_sequences) ? body.stop_sequences : [],
    maxTokens: Number(body.max_tokens),
    reasoning: body.thinking?.type === 'enabled',
  };
}

export const CHAT_FINISH: Record<StopKind, string> = {
  end: 'stop',
  length: 'length',
  stop_sequence: 'stop',
  tool: 'tool_calls',
  refusal: 'content_filter',
};

export const MESSAGES_STOP: Record<StopKind, string> = {
  end: 'end_turn',
  length: 'max_tokens',
  stop_sequence: 'stop_sequence',
  tool: 'tool_use',
  refusal: 'refusal',
};
