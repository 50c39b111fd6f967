// The sandbox provider: a real HTTP server of ours speaking the OpenAI-compatible
// (/openai/v1/{chat/completions,responses,embeddings}), Anthropic (/anthropic/v1/messages) and
// System One (/systemone/v1/systemone) wire formats, deterministically, so the gateway works
// offline. Faults are injected per request, by a path segment in front of the API prefix
// (`/~latency=200,status=500/openai/v1/...`, so a catalog entry can describe a faulty provider) or
// by `x-sandbox-*` headers (for direct calls):
//   latency=<ms>     wait before answering          status=<code>     answer with that error
//   overloaded       529 overloaded_error           timeout           never answer
//   retry_after=<s>  Retry-After on the error       fail_first=<n>    only the first n calls fail
//   max_words=<n>    longest answer (default 12)    chunk_delay=<ms>  wait between streamed events
//   fail_after=<n>   a stream's connection is cut after n events of output
// `"stream": true` streams chat, messages and responses answers as their providers do
// (devstack/sandbox/stream.ts), honouring backpressure; GET /_streamed counts the events written per call key.
// GET /_calls counts calls per fault spec and path; GET /_aborted counts those whose client hung up
// before the answer (how tests see that the gateway cancelled an upstream call).
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { countTokens, distribution, hashOf, optionLogprobs, seeded, sentence, textOf } from './generate';
import { CHAT_FINISH, chatView, decide, isServerTool, MESSAGES_STOP, messagesView } from './conversation';
import { encodeEvent, STREAMERS } from './stream';

type Json = Record<string, any>;
type Flavor = 'openai' | 'anthropic' | 'systemone';

class HttpFailure extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly type = 'invalid_request_error',
  ) {
    super(message);
  }
}

interface Faults {
  latencyMs: number;
  status: number | null;
  overloaded: boolean;
  hang: boolean;
  retryAfter: number | null;
  failFirst: number | null;
  maxWords: number;
  chunkDelayMs: number;
  failAfter: number | null;
  /** Bytes of padding: a field of the answer, or a comment line before a stream's first event (a broken provider's answer). */
  pad: number;
  spec: string;
}

function parseFaults(segment: string, headers: http.IncomingHttpHeaders): Faults {
  const kv = new Map<string, string>();
  for (const part of segment.split(',').filter(Boolean)) {
    const [k, v = ''] = part.split('=');
    kv.set(k, v);
  }
  for (const [name, value] of Object.entries(headers)) {
    if (name.startsWith('x-sandbox-') && typeof value === 'string') kv.set(name.slice('x-sandbox-'.length).replace(/-/g, '_'), value);
  }
  const num = (k: string) => (kv.has(k) ? Number(kv.get(k)) : null);
  return {
    latencyMs: num('latency') ?? 0,
    status: num('status'),
    overloaded: kv.has('overloaded'),
    hang: kv.has('timeout'),
    retryAfter: num('retry_after'),
    failFirst: num('fail_first'),
    maxWords: num('max_words') ?? 12,
    chunkDelayMs: num('chunk_delay') ?? 0,
    failAfter: num('fail_after'),
    pad: num('pad') ?? 0,
    spec: [...kv.entries()]
      .map(([k, v]) => `${k}=${v}`)
      .sort()
      .join(','),
  };
}

function errorBody(flavor: Flavor, status: number, type: string, message: string): Json {
  return flavor === 'anthropic' ? { type: 'error', error: { type, message } } : { error: { message, type, code: status } };
}

const CREATED = 1_767_225_600; // fixed, so answers are byte-for-byte repeatable
/** Prompt tokens an `input_audio` part counts (OpenAI counts about 10 a second of speech). */
const AUDIO_PART_TOKENS = 100;

function chatCompletion(body: Json, maxWords: number): Json {
  if (!Array.isArray(body.messages) || body.messages.length === 0) throw new HttpFailure(400, 'messages: must be a non-empty array');
  // Stop sequences cut the answer the request would get without them, as they cut a real model's.
  const { stop: _stop, ...unstopped } = body;
  const hash = hashOf(unstopped);
  const rand = seeded(hash);
  const promptText = body.messages.map((m: Json) => textOf(m.content)).join('\n');
  const lastUser = [...body.messages].reverse().find((m: Json) => m.role === 'user');
  const labels =
    /one of: ([^\n]+)$/im
      .exec(textOf(lastUser?.content ?? ''))?.[1]
      .split(',')
      .map((s) => s.trim())
      .filter(Boolean) ?? [];
  const topK = Math.min(Number(body.top_logprobs ?? 0), 20);
  let content = '';
  let logprobs: Json | null = null;
  let completionTokens = 0;
  if (labels.length > 0) {
    // A constrained question: answer with one label, log-probabilities over the labels plus a
    // little mass on unrelated tokens, as a real model spreads it.
    const ranked = [
      ...optionLogprobs(rand, labels),
      { token: ' The', logprob: Math.log(0.02) },
      { token: ' I', logprob: Math.log(0.01) },
    ].sort((a, b) => b.logprob - a.logprob);
    content = ranked[0].token;
    completionTokens = 1;
    if (body.logprobs) {
      logprobs = {
        content: [
          {
            token: content,
            logprob: ranked[0].logprob,
            bytes: null,
            top_logprobs: ranked.slice(0, topK).map((t) => ({ ...t, bytes: null })),
          },
        ],
      };
    }
  } else {
    const view = chatView(body);
    const outcome = decide(view, rand, maxWords, hash);
    const message: Json = { role: 'assistant', content: outcome.toolCall ? null : outcome.text };
    if (outcome.stop === 'refusal') Object.assign(message, { content: null, refusal: outcome.text });
    if (outcome.reasoning) message.reasoning = outcome.reasoning;
    if (outcome.toolCall) {
      const { id, name, arguments: args } = outcome.toolCall;
      message.tool_calls = [{ id, type: 'function', function: { name, arguments: JSON.stringify(args) } }];
    }
    const said = [outcome.reasoning, outcome.text, outcome.toolCall && JSON.stringify(outcome.toolCall.arguments)]
      .filter(Boolean)
      .join(' ');
    completionTokens = said.split(' ').length;
    if (body.logprobs && !outcome.toolCall) {
      logprobs = {
        content: outcome.text.split(' ').map((w) => ({ token: w, logprob: Math.log(0.5 + rand() / 2), bytes: null, top_logprobs: [] })),
      };
    }
    // Audio, as OpenAI's audio models take and give it: heard parts count AUDIO_PART_TOKENS each, and
    // a call asking for audio gets its answer spoken (its transcript the text), every output token audio.
    const heard =
      body.messages.reduce(
        (n: number, m: Json) => n + (Array.isArray(m.content) ? m.content : []).filter((p: Json) => p?.type === 'input_audio').length,
        0,
      ) * AUDIO_PART_TOKENS;
    const speaks = Array.isArray(body.modalities) && body.modalities.includes('audio') && typeof message.content === 'string';
    if (speaks) {
      const transcript = message.content as string;
      message.audio = {
        id: `audio_${hash.slice(0, 20)}`,
        data: Buffer.from(transcript).toString('base64'),
        expires_at: CREATED + 3600,
        transcript,
      };
      message.content = null;
    }
    return chatAnswer(
      body,
      hash,
      message,
      logprobs,
      CHAT_FINISH[outcome.stop],
      countTokens(promptText) + 85 * view.images + heard,
      completionTokens,
      { heard, spoken: speaks ? completionTokens : 0 },
    );
  }
  return chatAnswer(body, hash, { role: 'assistant', content }, logprobs, 'stop', countTokens(promptText), completionTokens);
}

function chatAnswer(
  body: Json,
  hash: string,
  message: Json,
  logprobs: Json | null,
  finish: string,
  promptTokens: number,
  completionTokens: number,
  audio: { heard: number; spoken: number } = { heard: 0, spoken: 0 },
): Json {
  // `n` answers, each billed (the same one n times: it is the request's answer).
  const n = Number.isInteger(body.n) && body.n > 1 ? Math.min(body.n, 128) : 1;
  const output = completionTokens * n;
  // Audio is counted in the prompt and completion tokens, and named apart as OpenAI names it.
  const details = {
    ...(audio.heard && { prompt_tokens_details: { cached_tokens: 0, audio_tokens: audio.heard } }),
    ...(audio.spoken && { completion_tokens_details: { reasoning_tokens: 0, audio_tokens: audio.spoken * n } }),
  };
  return {
    id: `chatcmpl-${hash.slice(0, 24)}`,
    object: 'chat.completion',
    created: CREATED,
    model: body.model,
    choices: Array.from({ length: n }, (_, index) => ({ index, message, logprobs, finish_reason: finish })),
    // The tier that served it, as OpenAI names it.
    service_tier: typeof body.service_tier === 'string' && body.service_tier !== 'auto' ? body.service_tier : 'default',
    usage: { prompt_tokens: promptTokens, completion_tokens: output, total_tokens: promptTokens + output, ...details },
  };
}

function response(body: Json, maxWords: number): Json {
  if (body.input === undefined) throw new HttpFailure(400, 'input: is required');
  const hash = hashOf(body);
  const text = sentence(seeded(hash), Math.max(1, Math.min(Number(body.max_output_tokens ?? maxWords), maxWords)));
  const input = countTokens(textOf(body.instructions ?? '') + textOf(body.input));
  const output = text.split(' ').length;
  const head = { id: `resp_${hash.slice(0, 24)}`, object: 'response', created_at: CREATED, model: body.model };
  // As OpenAI answers a background response: queued, no output or usage yet (the answer, and its
  // bill, come later to whoever fetches it by id).
  if (body.background === true && body.stream !== true) return { ...head, status: 'queued', output: [], usage: null };
  return {
    ...head,
    status: 'completed',
    output: [
      // Each web search tool runs once, listed before the answer as OpenAI lists its searches.
      ...(body.tools ?? [])
        .filter(isServerTool)
        .map((_: Json, i: number) => ({ type: 'web_search_call', id: `ws_${hash.slice(0, 20)}${i}`, status: 'completed' })),
      {
        type: 'message',
        id: `msg_${hash.slice(24, 48)}`,
        status: 'completed',
        role: 'assistant',
        content: [{ type: 'output_text', text, annotations: [] }],
      },
    ],
    usage: { input_tokens: input, output_tokens: output, total_tokens: input + output },
  };
}

function embeddings(body: Json): Json {
  const inputs: unknown[] = Array.isArray(body.input) ? body.input : [body.input];
  if (body.input === undefined || inputs.length === 0) throw new HttpFailure(400, 'input: is required');
  const dims = Number(body.dimensions ?? 16);
  if (!Number.isInteger(dims) || dims < 1 || dims > 4096) throw new HttpFailure(400, 'dimensions: must be 1 to 4096');
  const data = inputs.map((input, index) => {
    const rand = seeded(hashOf([body.model, input]));
    const v = Array.from({ length: dims }, () => rand() * 2 - 1);
    const norm = Math.hypot(...v) || 1;
    const unit = v.map((x) => x / norm);
    // As OpenAI does: base64 of little-endian float32s when asked (the official SDK asks by default).
    const embedding = body.encoding_format === 'base64' ? Buffer.from(new Float32Array(unit).buffer).toString('base64') : unit;
    return { object: 'embedding', index, embedding };
  });
  const tokens = inputs.reduce<number>((n, i) => n + countTokens(textOf(i)), 0);
  return { object: 'list', data, model: body.model, usage: { prompt_tokens: tokens, total_tokens: tokens } };
}

function message(body: Json, maxWords: number): Json {
  if (!Array.isArray(body.messages) || body.messages.length === 0) throw new HttpFailure(400, 'messages: must be a non-empty array');
  if (!Number.isInteger(body.max_tokens)) throw new HttpFailure(400, 'max_tokens: Field required');
  const { stop_sequences: _stops, ...unstopped } = body;
  const hash = hashOf(unstopped);
  const view = messagesView(body);
  const outcome = decide(view, seeded(hash), maxWords, hash);
  const content: Json[] = [];
  if (outcome.reasoning) content.push({ type: 'thinking', thinking: outcome.reasoning, signature: `sig_${hash.slice(0, 16)}` });
  if (outcome.text) content.push({ type: 'text', text: outcome.text });
  if (outcome.toolCall)
    content.push({ type: 'tool_use', id: `toolu_${hash.slice(0, 20)}`, name: outcome.toolCall.name, input: outcome.toolCall.arguments });
  const said = [outcome.reasoning, outcome.text, outcome.toolCall && JSON.stringify(outcome.toolCall.arguments)].filter(Boolean).join(' ');
  return {
    id: `msg_${hash.slice(0, 24)}`,
    type: 'message',
    role: 'assistant',
    model: body.model,
    content,
    stop_reason: MESSAGES_STOP[outcome.stop],
    stop_sequence: outcome.stopSequence,
    usage: messagesUsage(
      body,
      countTokens(textOf(body.system ?? '') + body.messages.map((m: Json) => textOf(m.content)).join('\n')) + 85 * view.images,
      said.split(' ').length,
    ),
  };
}

/** Prompt prefixes marked with cache_control, as Anthropic's prompt cache holds them (here for good, up to 10,000). */
const cachedPrefixes = new Set<string>();

/**
 * Usage as Anthropic reports it: the prompt up to its last block marked `cache_control` is written to
 * the cache the first time and read from it after, and counted apart from input_tokens.
 */
function messagesUsage(body: Json, promptTokens: number, outputTokens: number): Json {
  const blocks: Json[] = [
    ...(Array.isArray(body.system) ? body.system : []),
    ...body.messages.flatMap((m: Json) => (Array.isArray(m.content) ? m.content : [{ type: 'text', text: textOf(m.content) }])),
  ];
  const last = blocks.map((b) => Boolean(b?.cache_control)).lastIndexOf(true);
  let cached = 0;
  let written = false;
  const hour = last >= 0 && blocks[last].cache_control?.ttl === '1h';
  if (last >= 0) {
    const prefix = blocks.slice(0, last + 1);
    cached = Math.min(promptTokens, countTokens(prefix.map((b) => textOf(b.text ?? b.content ?? '')).join('\n')));
    const key = hashOf(prefix);
    written = !cachedPrefixes.has(key);
    if (cachedPrefixes.size >= 10_000) cachedPrefixes.clear();
    cachedPrefixes.add(key);
  }
  const searches = (body.tools ?? []).filter(isServerTool).length;
  return {
    ...(searches && { server_tool_use: { web_search_requests: searches } }),
    input_tokens: promptTokens - cached,
    cache_creation_input_tokens: written ? cached : 0,
    cache_creation: { ephemeral_5m_input_tokens: written && !hour ? cached : 0, ephemeral_1h_input_tokens: written && hour ? cached : 0 },
    cache_read_input_tokens: written ? 0 : cached,
    output_tokens: outputTokens,
  };
}

/** Native System One: answers every question with a full distribution, as the hosted model does. */
function systemOne(body: Json): Json {
  if (body.state === undefined || !body.questions || typeof body.questions !== 'object')
    throw new HttpFailure(400, 'state and questions are required');
  const rand = seeded(hashOf(body));
  const answers: Json = {};
  for (const [name, q] of Object.entries<Json>(body.questions)) {
    if (q.type === 'noul') {
      answers[name] = { type: 'noul', noul: distribution(rand, 2)[1] };
    } else if (q.type === 'choice') {
      const labels = Object.keys(q.criteria ?? {});
      const p = distribution(rand, labels.length);
      const best = p.indexOf(Math.max(...p));
      const n = labels.length;
      answers[name] = {
        type: 'choice',
        choice: labels[best],
        confidence: n === 1 ? 1 : (n * p[best] - 1) / (n - 1),
        probabilities: Object.fromEntries(labels.map((l, i) => [l, p[i]])),
      };
    } else if (q.type === 'score') {
      const n = (q.criteria ?? []).length;
      const p = distribution(rand, n);
      const m = p.indexOf(Math.max(...p));
      const d = p.reduce((s, pi, i) => s + pi * Math.abs(i - m), 0);
      const u = Math.floor((n * n) / 4) / n;
      answers[name] = {
        type: 'score',
        score: p.reduce((s, pi, i) => s + i * pi, 0),
        confidence: n === 1 ? 1 : Math.max(0, 1 - d / u),
        probabilities: Object.fromEntries(p.map((pi, i) => [String(i), pi])),
        legend: Object.fromEntries((q.criteria as unknown[]).map((c, i) => [String(i), c])),
      };
    } else {
      throw new HttpFailure(400, `questions.${name}.type: unknown question type`);
    }
  }
  const input = countTokens(textOf(body.state) + JSON.stringify(body.questions));
  return { model: String(body.model), answers, usage: { input_tokens: input, output_tokens: 2 * Object.keys(answers).length } };
}

const ROUTES: Record<string, { flavor: Flavor; handle: (b: Json, maxWords: number) => Json }> = {
  '/openai/v1/chat/completions': { flavor: 'openai', handle: chatCompletion },
  '/openai/v1/responses': { flavor: 'openai', handle: response },
  '/openai/v1/embeddings': { flavor: 'openai', handle: embeddings },
  '/anthropic/v1/messages': { flavor: 'anthropic', handle: message },
  '/systemone/v1/systemone': { flavor: 'systemone', handle: systemOne },
};

function send(res: http.ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(text)), ...headers });
  res.end(text);
}

/** Writes the events at the pace the faults say, waiting for the reader whenever its buffer is full. */
async function stream(
  res: http.ServerResponse,
  events: ReturnType<(typeof STREAMERS)[string]>,
  faults: Faults,
  progress: (written: number) => void,
): Promise<void> {
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  if (faults.pad > 0 && !res.write(`:${'x'.repeat(faults.pad)}\n`)) await new Promise((r) => res.once('drain', r).once('close', r));
  let content = 0;
  let i = -1;
  for (const e of events) {
    i++;
    if (res.destroyed) return;
    if (faults.chunkDelayMs > 0 && i > 0) await new Promise((r) => setTimeout(r, faults.chunkDelayMs));
    const dying = e.content && faults.failAfter !== null && ++content >= faults.failAfter;
    if (dying) {
      // The provider dies mid-stream, once what it sent has reached the socket.
      await new Promise<void>((r) => res.write(encodeEvent(e), () => r()));
      progress(i + 1);
      res.destroy();
      return;
    }
    if (!res.write(encodeEvent(e))) await new Promise((r) => res.once('drain', r).once('close', r));
    progress(i + 1);
  }
  res.end();
}

function createSandboxServer(): http.Server {
  const calls = new Map<string, number>(); // per fault spec and path: drives fail_first, read by /_calls
  const aborted = new Map<string, number>(); // calls whose client hung up before the answer, read by /_aborted
  const streamed = new Map<string, number>(); // streamed events written, read by /_streamed
  const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

  return http.createServer(async (req, res) => {
    const url = new URL(req.url ?? '/', 'http://sandbox');
    if (req.method === 'GET' && url.pathname === '/healthz') return send(res, 200, { status: 'ok', provider: 'sandbox' });
    if (url.pathname === '/_calls') {
      if (req.method === 'DELETE') calls.clear();
      return send(res, 200, Object.fromEntries(calls));
    }
    if (url.pathname === '/_aborted') return send(res, 200, Object.fromEntries(aborted));
    if (url.pathname === '/_streamed') return send(res, 200, Object.fromEntries(streamed));
    const m = /^(?:\/~([^/]*))?(\/.*)$/.exec(url.pathname)!;
    const route = ROUTES[m[2]];
    if (!route || req.method !== 'POST')
      return send(res, 404, errorBody('openai', 404, 'not_found', `sandbox: no route for ${req.method} ${url.pathname}`));
    const faults = parseFaults(decodeURIComponent(m[1] ?? ''), req.headers);
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const callKey = `${faults.spec}|${m[2]}`;
    const n = (calls.get(callKey) ?? 0) + 1;
    calls.set(callKey, n);
    res.once('close', () => {
      if (!res.writableFinished) aborted.set(callKey, (aborted.get(callKey) ?? 0) + 1);
    });

    if (faults.hang) return; // the client's timeout is what ends this
    if (faults.latencyMs > 0) await sleep(faults.latencyMs);
    const failing = faults.failFirst === null || n <= faults.failFirst;
    if (failing && (faults.overloaded || faults.status)) {
      const status = faults.overloaded ? 529 : faults.status!;
      const type = faults.overloaded
        ? 'overloaded_error'
        : status === 429
          ? 'rate_limit_error'
          : status >= 500
            ? 'api_error'
            : 'invalid_request_error';
      return send(
        res,
        status,
        errorBody(route.flavor, status, type, `sandbox: injected ${faults.overloaded ? 'overload' : `status ${status}`}`),
        faults.retryAfter !== null ? { 'retry-after': String(faults.retryAfter) } : {},
      );
    }
    let body: Json;
    try {
      body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
    } catch {
      return send(res, 400, errorBody(route.flavor, 400, 'invalid_request_error', 'sandbox: body is not JSON'));
    }
    try {
      // A streamed answer is the same text as the answer to the same request unstreamed.
      const { stream: wantsStream, stream_options: _options, ...question } = body;
      const full = route.handle(question, faults.maxWords);
      const streamer = STREAMERS[m[2]];
      if (wantsStream === true && streamer) return await stream(res, streamer(full, body), faults, (n) => streamed.set(callKey, n));
      send(res, 200, faults.pad > 0 ? { ...full, sandbox_padding: 'x'.repeat(faults.pad) } : full, {
        'x-sandbox-request-id': hashOf(body).slice(0, 16),
      });
    } catch (err) {
      const f = err instanceof HttpFailure ? err : new HttpFailure(500, 'sandbox: internal error', 'api_error');
      send(res, f.status, errorBody(route.flavor, f.status, f.type, f.message));
    }
  });
}

export async function listenSandbox(host: string, port: number): Promise<{ url: string; close(): Promise<void> }> {
  const server = createSandboxServer();
  server.keepAliveTimeout = 65_000;
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve());
  });
  const { port: bound } = server.address() as AddressInfo;
  return {
    url: `http://${host}:${bound}`,
    close: () =>
      new Promise((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
