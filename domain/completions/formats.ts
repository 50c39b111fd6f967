// The four inference wire formats as the gateway answers them: what a finished answer carries
// (our generation id, the dated model id, the provider, usage with its cost), and, for the three
// that stream, how each upstream event is relayed and counted and how a stream cut short ends.
// OpenAI chat streams bare `data:` chunks ending with `data: [DONE]`; Anthropic messages and OpenAI
// responses stream typed events (`event: <type>`).
import type { EventSourceMessage } from 'eventsource-parser';
import type { GatewayError } from '../../infrastructure/errors';
import { openai } from '../../infrastructure/providers/formats/openai';
import { anthropicUsage } from '../../infrastructure/providers/formats/anthropic';
import type { Usage } from '../../infrastructure/providers/formats';
import { jsonObject } from '../../infrastructure/providers/formats/format';
import { withCounted, type CountedFromRequest } from './counted-from-request';
import { withFields } from '../../infrastructure/objects/with-fields';

export type InferenceOperation = 'chat' | 'messages' | 'responses' | 'embeddings';
export type StreamingOperation = Exclude<InferenceOperation, 'embeddings'>;

/** Who answered, as every answer names it. */
export interface Served {
  id: string;
  /** The dated canonical id of the model that answered (a fallback model, if one did). */
  model: string;
  /** Null only in an error told before any provider answered. */
  provider: string | null;
}

/** What a stream has shown so far: what the upstream reported, and what it produced. */
export class StreamTally {
  /** Every prompt token the upstream reported, cached ones included. */
  input: number | null = null;
  /** Of them, read from and written to the provider's prompt cache. */
  cacheRead = 0;
  cacheWrite = 0;
  cacheWrite1h = 0;
  /** Web searches the upstream reported running. */
  webSearches = 0;
  /** Of the prompt and the output the upstream reported, audio tokens. */
  audioInput = 0;
  audioOutput = 0;
  /** The call asked for audio: output the upstream never totalled is billed as audio. */
  audioAsked = false;
  /** What the request counts beyond the upstream's usage (counted-from-request.ts). */
  counted: CountedFromRequest = {};
  output: number | null = null;
  /** Events carrying output (about one token each), for billing a stream the upstream never totalled. */
  produced = 0;
  /** The upstream's own end of stream arrived. */
  finished = false;
  /** The upstream ended the stream with its own error event. */
  upstreamError: string | null = null;
  /** Responses events are numbered; an error event we add continues the numbering. */
  sequence = -1;

  /** What the upstream reported, output aside: the prompt, its cached parts, web searches. */
  reported(u: Usage): void {
    this.input = u.input_tokens;
    this.cacheRead = u.cache_read_tokens ?? 0;
    this.cacheWrite = u.cache_write_tokens ?? 0;
    this.cacheWrite1h = u.cache_write_1h_tokens ?? 0;
    this.webSearches = u.web_searches ?? this.webSearches;
    this.audioInput = u.audio_input_tokens ?? 0;
    this.audioOutput = u.audio_output_tokens ?? 0;
  }

  /** Usage to bill: what the upstream reported when it finished, else what it produced. */
  usage(inputEstimate: number): Usage {
    const reported = this.finished && this.output !== null;
    const output = reported ? this.output! : Math.max(this.output ?? 0, this.produced);
    const spoken = reported ? this.audioOutput : this.audioAsked ? output : 0;
    return withCounted(
      {
        input_tokens: this.input ?? inputEstimate,
        output_tokens: output,
        ...(this.input !== null && this.cacheRead && { cache_read_tokens: this.cacheRead }),
        ...(this.input !== null && this.cacheWrite && { cache_write_tokens: this.cacheWrite }),
        ...(this.input !== null && this.cacheWrite1h && { cache_write_1h_tokens: this.cacheWrite1h }),
        ...(this.webSearches && { web_searches: this.webSearches }),
        ...(this.input !== null && this.audioInput && { audio_input_tokens: this.audioInput }),
        ...(spoken && { audio_output_tokens: spoken }),
      },
      this.counted,
    );
  }
}

interface RelayOptions {
  /** The client asked for usage in the stream (`stream_options.include_usage`, `usage.include`). */
  includeUsage: boolean;
  cost: (usage: Usage) => number;
}

type Json = Record<string, any>;

const sse = (event: string | null, data: unknown) => `${event ? `event: ${event}\n` : ''}data: ${JSON.stringify(data)}\n\n`;

/** A finished, non-streamed answer in its own format, naming us rather than the upstream. */
export function finishBody(operation: InferenceOperation, body: Json, served: Served, usage: Usage, cost: number): Json {
  const out: Json = withFields(body, { id: served.id, model: served.model, provider: served.provider });
  out.usage = withFields(body.usage ?? usageFields(operation, usage), { cost });
  return out;
}

function usageFields(operation: InferenceOperation, u: Usage): Json {
  if (operation === 'chat')
    return { prompt_tokens: u.input_tokens, completion_tokens: u.output_tokens, total_tokens: u.input_tokens + u.output_tokens };
  if (operation === 'embeddings') return { prompt_tokens: u.input_tokens, total_tokens: u.input_tokens };
  return { input_tokens: u.input_tokens, output_tokens: u.output_tokens };
}

export interface StreamFormat {
  /** The text to send the client for one upstream event (null: nothing), counting it in the tally. */
  relay(event: EventSourceMessage, served: Served, tally: StreamTally, opts: RelayOptions): string | null;
  /** The last words of a stream cut short after it began: an error in this format's grammar. */
  error(err: GatewayError, served: Served, tally: StreamTally): string;
}

const chat: StreamFormat = {
  relay(event, served, tally, opts) {
    if (event.data.trim() === '[DONE]') {
      tally.finished = true;
      return 'data: [DONE]\n\n';
    }
    const chunk = jsonObject(event.data);
    if (!chunk) return null;
    if (chunk.error) tally.upstreamError = String(chunk.error.message ?? 'upstream error');
    chunk.id = served.id;
    chunk.model = served.model;
    chunk.provider = served.provider;
    const choices: Json[] = Array.isArray(chunk.choices) ? chunk.choices : [];
    for (const c of choices) {
      const d = c?.delta;
      if (d && (d.content || d.tool_calls || d.reasoning || d.refusal || d.audio)) tally.produced++;
    }
    if (chunk.usage) {
      const u = openai.usageOf('chat', chunk);
      tally.reported(u);
      tally.output = u.output_tokens;
      if (!opts.includeUsage) {
        if (!choices.length) return null; // the usage-only chunk the client did not ask for
        delete chunk.usage;
      } else {
        chunk.usage = withFields(chunk.usage, { cost: opts.cost(u) });
      }
    }
    return sse(null, chunk);
  },
  error(err, served) {
    // As OpenRouter ends a failed stream: a chunk with `error` (the OpenAI SDK raises it) and finish_reason "error".
    const chunk = {
      id: served.id,
      object: 'chat.completion.chunk',
      created: Math.floor(Date.now() / 1000),
      model: served.model,
      provider: served.provider,
      error: { code: err.status, message: err.message, metadata: err.metadata },
      choices: [{ index: 0, delta: { content: '' }, finish_reason: 'error' }],
    };
    return `${sse(null, chunk)}data: [DONE]\n\n`;
  },
};

const ANTHROPIC_ERROR_TYPES: Record<number, string> = {
  429: 'rate_limit_error',
  524: 'timeout_error',
  529: 'overloaded_error',
};

const messages: StreamFormat = {
  relay(event, served, tally, opts) {
    const data = jsonObject(event.data);
    if (!data) return null;
    const type = event.event ?? data.type;
    if (type === 'message_start' && data.message) {
      Object.assign(data.message, { id: served.id, model: served.model, provider: served.provider });
      const u = data.message.usage ?? {};
      if (Number.isFinite(u.input_tokens)) tally.reported(anthropicUsage(u));
      if (Number.isFinite(u.output_tokens)) tally.output = u.output_tokens;
    } else if (type === 'content_block_delta') {
      tally.produced++;
    } else if (type === 'message_delta' && data.usage) {
      // Cumulative counts; the cache's, when left out, are those message_start gave.
      if (Number.isFinite(data.usage.input_tokens))
        tally.reported(
          anthropicUsage({
            cache_read_input_tokens: tally.cacheRead,
            cache_creation_input_tokens: tally.cacheWrite,
            cache_creation: { ephemeral_1h_input_tokens: tally.cacheWrite1h },
            ...data.usage,
          }),
        );
      if (Number.isFinite(data.usage.output_tokens)) tally.output = data.usage.output_tokens;
      const searches = data.usage.server_tool_use?.web_search_requests;
      if (Number.isFinite(searches)) tally.webSearches = searches;
      data.usage.cost = opts.cost({ ...tally.usage(0), output_tokens: tally.output ?? 0 });
    } else if (type === 'message_stop') {
      tally.finished = true;
    } else if (type === 'error') {
      tally.upstreamError = String(data.error?.message ?? 'upstream error');
    }
    return sse(type, data);
  },
  error(err) {
    const type = ANTHROPIC_ERROR_TYPES[err.status] ?? (err.status >= 500 ? 'api_error' : 'invalid_request_error');
    return sse('error', { type: 'error', error: { type, message: err.message } });
  },
};

const responses: StreamFormat = {
  relay(event, served, tally, opts) {
    const data = jsonObject(event.data);
    if (!data) return null;
    const type = event.event ?? data.type;
    if (Number.isInteger(data.sequence_number)) tally.sequence = data.sequence_number;
    if (data.response && typeof data.response === 'object') {
      Object.assign(data.response, { id: served.id, model: served.model, provider: served.provider });
      if (data.response.usage) {
        const u = openai.usageOf('responses', data.response);
        tally.reported(u);
        tally.output = u.output_tokens;
        data.response.usage = withFields(data.response.usage, { cost: opts.cost(u) });
      }
    }
    if (type === 'response.output_text.delta' || type === 'response.function_call_arguments.delta') tally.produced++;
    if (type === 'response.completed' || type === 'response.incomplete' || type === 'response.failed') tally.finished = true;
    if (type === 'error') tally.upstreamError = String(data.message ?? 'upstream error');
    return sse(type, data);
  },
  error(err, _served, tally) {
    tally.sequence++;
    return sse('error', {
      type: 'error',
      code: err.status >= 500 ? 'server_error' : 'invalid_request',
      message: err.message,
      param: null,
      sequence_number: tally.sequence,
    });
  },
};

export const STREAM_FORMATS: Record<StreamingOperation, StreamFormat> = { chat, messages, responses };
