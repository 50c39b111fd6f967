// Proxy overhead, side by side in one run on one machine: the same non-streamed chat completion
// sent (a) straight to the sandbox provider, (b) through the gateway (auth, rate limit, 402 gate,
// routing, usage record durably written) and (c) through the Portkey open-source gateway pointed at
// the sandbox as a custom OpenAI-compatible host, at concurrency 1, 50 and 200, with CPU per request
// of every process; then a streamed completion through each, for time to first token, tokens per
// second, and whether chunks arrive one by one (none held back). Translated rows: the OpenAI shape
// to an Anthropic-format provider and the reverse, against the untranslated gateway rows. Floor
// rows: bare Node and Koa forwarders (floor-proxy.ts), what any Node gateway here adds at least.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { request } from 'undici';
import { createParser } from 'eventsource-parser';
import { DEFAULT_CATALOG_PATH } from '../infrastructure/config';
import { endpointEntry, modelEntry, providerEntry } from '../domain/catalog/entries';
import { startProcess, freePort, type ManagedProcess } from '../devstack/processes';
import { benchKey, closedLoop, measuredInRounds, prime, round2, startStack, writeResult, type MeasuredRow } from './harness';
import { wakeRoundTrip } from './wake-rtt';

const BARS = {
  added_p50_ms_at_c1: 0.3,
  /** The gateway's added p50 at c=1 at most this share of Portkey's. */
  added_p50_share_of_portkey: 0.4,
  /** The gateway's req/s at c=50 at least this multiple of Portkey's. */
  rps_at_c50_times_portkey: 3,
  max_p99_ms_at_c200: 200,
  added_ttft_p50_ms: 2,
  translated_extra_p50_ms: 0.1,
};

type TargetName =
  | 'direct'
  | 'gateway'
  | 'gateway_2p'
  | 'portkey'
  | 'floor_node'
  | 'floor_koa'
  | 'direct_messages'
  | 'gateway_messages'
  | 'chat_to_messages'
  | 'messages_to_chat';

/** What each proxied target's added latency is measured against: the provider it ends at, called directly. */
const BASELINE: Record<string, TargetName> = {
  gateway: 'direct',
  gateway_2p: 'direct',
  portkey: 'direct',
  floor_node: 'direct',
  floor_koa: 'direct',
  gateway_messages: 'direct_messages',
  chat_to_messages: 'direct_messages',
  messages_to_chat: 'direct',
};
const TOTALS: Record<number, number> = { 1: 2000, 50: 10_000, 200: 10_000 };
const STREAMS = 40;
/** Short streams sent to a target right before each of its measured ones (see `streamed`). */
const STREAM_PRIMER_MS = 100;
/** Rounds each load level is split into, targets taking turns (see measuredInRounds). */
const ROUNDS = 4;
/** A streamed answer: words at the provider's pace (one event each). */
const STREAM_WORDS = 200;
const STREAM_GAP_MS = 2;
/**
 * Requests per target before anything is measured. V8 keeps optimising a server's request path
 * for its first few thousand requests: measured at c=1 right after start, the gateway's CPU per
 * request fell from 1.5 to 0.8 ms over its first 4,000 requests, and its added p50 from 1.45 to
 * 1.05 ms. A server in use is past that, so every target gets the same warm-up, streamed path too
 * (short streams: it is the per-request code that needs the repetitions), per process: a target
 * served by several processes gets that many times the requests, at that many times the
 * concurrency, since each process is warmed by the connections it accepts (`gateway_2p`'s two
 * processes had been warmed by about 2,500 requests each). In `rounds`, each on new connections:
 * processes sharing a port take connections unevenly (the kernel wakes one first), and one round
 * of 16 connections left one of `gateway_2p`'s two processes with 14-21% of the warm-up's CPU, its
 * calls then costing 0.71-0.75 ms of CPU each against 0.43 after ten rounds (split 54/46).
 */
const WARM_UP = { requests: 5_000, concurrency: 8, rounds: 10, streams: 500, streamConcurrency: 4, streamWords: 4 };
/** Processes serving a target, where more than one. */
const PROCESSES: Partial<Record<TargetName, number>> = { gateway_2p: 2 };

const messages = [{ role: 'user', content: 'Say this is a test' }];
/** The non-streamed call every target is sent (with its model); with `stream: true`, the short streams. */
const body = { messages, max_tokens: 16 };

/** `api`: the shape the target speaks (what its answers and stream events look like). */
type Target = { url: string; headers: Record<string, string>; model: string; api?: 'chat' | 'messages' };

/** A whole answer in the target's shape. */
const answered = (t: Target) => (t.api === 'messages' ? '"content"' : '"choices"');

function benchCatalog(): string {
  const catalog = JSON.parse(fs.readFileSync(DEFAULT_CATALOG_PATH, 'utf8'));
  const provider = (slug: string, faults: string, adapter: 'openai' | 'anthropic' = 'openai') =>
    providerEntry(slug, `\${SANDBOX_URL}/${faults}${adapter === 'openai' ? 'openai/v1' : 'anthropic'}`, {
      adapter,
      max_concurrency: 1000,
      timeout_ms: 30_000,
    });
  catalog.providers.push(
    provider('bench', ''),
    provider('bench-stream', `~max_words=${STREAM_WORDS},chunk_delay=${STREAM_GAP_MS}/`),
    provider('bench-stream-warm', `~max_words=${WARM_UP.streamWords}/`),
    provider('bench-claude', '', 'anthropic'),
    provider('bench-claude-stream', `~max_words=${STREAM_WORDS},chunk_delay=${STREAM_GAP_MS}/`, 'anthropic'),
    provider('bench-claude-stream-warm', `~max_words=${WARM_UP.streamWords}/`, 'anthropic'),
  );
  for (const [id, slug] of [
    ['bench/chat', 'bench'],
    ['bench/stream', 'bench-stream'],
    ['bench/stream-warm', 'bench-stream-warm'],
    ['bench/claude', 'bench-claude'],
    ['bench/claude-stream', 'bench-claude-stream'],
    ['bench/claude-stream-warm', 'bench-claude-stream-warm'],
  ]) {
    const endpoint = endpointEntry(slug, 0.1, {
      upstream_model: 'bench-model',
      pricing: { prompt: 0.1, completion: 0.4 },
      supported_parameters: ['max_tokens'],
    });
    catalog.models.push(modelEntry(id, [endpoint]));
  }
  const file = path.join(os.tmpdir(), `bench-catalog-${process.pid}.json`);
  fs.writeFileSync(file, JSON.stringify(catalog));
  return file;
}

/** A peer of the gateway's in the bench, started on a free port; resolves once it answers HTTP. */
async function startPeer(
  name: string,
  args: (port: number) => string[],
  env: Record<string, string>,
  waitMs: number,
): Promise<{ url: string; process: ManagedProcess }> {
  const port = await freePort();
  const proc = startProcess(name, process.execPath, args(port), { ...process.env, NODE_ENV: 'production', PORT: String(port), ...env });
  const url = `http://127.0.0.1:${port}`;
  await proc.waitUntil(
    async () => {
      await fetch(url);
    },
    waitMs,
    'listening',
  );
  return { url, process: proc };
}

function startPortkey(): Promise<{ url: string; process: ManagedProcess }> {
  const script = path.join(path.dirname(require.resolve('@portkey-ai/gateway/package.json')), 'build', 'start-server.js');
  // Portkey has no host flag and listens on every interface; the bench only talks to it on loopback.
  // The shim lets its streamed calls run on this Node (see portkey-shim.ts); non-streamed ones are untouched.
  const shim = path.join(__dirname, 'portkey-shim.js');
  return startPeer('portkey', (port) => ['--require', shim, script, `--port=${port}`, '--headless'], {}, 30_000);
}

/** A bare forwarder to the sandbox (floor-proxy.ts): `node` is node:http alone, `koa` Koa and its router. */
function startFloor(kind: 'node' | 'koa', sandboxUrl: string): Promise<{ url: string; process: ManagedProcess }> {
  const script = path.join(__dirname, 'floor-proxy.js');
  return startPeer(`floor_${kind}`, () => [script], { FLOOR_KIND: kind, FLOOR_UPSTREAM: sandboxUrl }, 15_000);
}

interface StreamStats {
  streams: number;
  errors: number;
  ttft_p50_ms: number;
  ttft_p90_ms: number;
  tokens_per_s_p50: number;
  /** Content events per network read at the client: 1.0 when every chunk arrives as it is produced. */
  events_per_read: number;
  /** What the first failed stream answered, to say why. */
  first_error: string | null;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const p90 = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.ceil(xs.length * 0.9) - 1)];

/** One streamed completion: when the first content arrived, how fast the rest followed, how it was read. */
async function streamOnce(t: Target): Promise<{ ttft: number; tps: number; events: number; reads: number } | { error: string }> {
  const t0 = performance.now();
  const res = await request(t.url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...t.headers },
    body: JSON.stringify({ model: t.model, messages, max_tokens: STREAM_WORDS, stream: true }),
  });
  let first = 0;
  let last = 0;
  let count = 0;
  let inRead = 0;
  let events = 0;
  let reads = 0;
  const parser = createParser({
    onEvent: (e) => {
      if (e.data === '[DONE]') return;
      const data = JSON.parse(e.data);
      const content = t.api === 'messages' ? data.delta?.text : data.choices?.[0]?.delta?.content;
      if (!content) return;
      last = performance.now();
      if (!count) first = last;
      count++;
      inRead++;
    },
  });
  const decoder = new TextDecoder();
  let head = '';
  for await (const chunk of res.body) {
    inRead = 0;
    const text = decoder.decode(chunk, { stream: true });
    if (head.length < 300) head += text;
    parser.feed(text);
    if (inRead) {
      reads++;
      events += inRead;
    }
  }
  if (res.statusCode !== 200 || count < STREAM_WORDS / 2) return { error: `HTTP ${res.statusCode}: ${head.slice(0, 300)}` };
  return { ttft: first - t0, tps: (count - 1) / ((last - first) / 1000), events, reads };
}

/**
 * STREAMS streamed completions per target, the targets taking turns (as measuredInRounds, against
 * drift), each right after STREAM_PRIMER_MS of short streams to the same target (`primers`): else
 * every stream would find its proxy asleep since its last one, while the provider, which serves
 * every target, is kept awake; the first event then paid the machine's wake-ups (wake-rtt.ts) at
 * the proxy's hops only.
 */
async function streamed(targets: Record<string, Target>, primers: Record<string, Target>): Promise<Record<string, StreamStats>> {
  const names = Object.keys(targets);
  const acc = Object.fromEntries(
    names.map((n) => [n, { ttft: [] as number[], tps: [] as number[], events: 0, reads: 0, errors: 0, firstError: null as string | null }]),
  );
  for (let i = 0; i < STREAMS; i++) {
    for (let j = 0; j < names.length; j++) {
      const name = names[(i + j) % names.length];
      const a = acc[name];
      const w = primers[name];
      const n = PROCESSES[name as TargetName] ?? 1;
      await prime(w.url, { ...body, model: w.model, stream: true }, w.headers, n, STREAM_PRIMER_MS);
      const r = await streamOnce(targets[name]);
      if ('error' in r) {
        a.errors++;
        a.firstError ??= r.error;
        continue;
      }
      a.ttft.push(r.ttft);
      a.tps.push(r.tps);
      a.events += r.events;
      a.reads += r.reads;
    }
  }
  return Object.fromEntries(
    names.map((n) => {
      const a = acc[n];
      const stats: StreamStats = {
        streams: STREAMS,
        errors: a.errors,
        ttft_p50_ms: round2(median(a.ttft)),
        ttft_p90_ms: round2(p90(a.ttft)),
        tokens_per_s_p50: Math.round(median(a.tps)),
        events_per_read: round2(a.events / Math.max(1, a.reads)),
        first_error: a.firstError,
      };
      return [n, stats];
    }),
  );
}

export async function benchProxy(opts: { levels?: number[] } = {}) {
  const levels = opts.levels ?? [1, 50, 200];
  // Measured before anything else runs: the machine's own cost of waking a process.
  const wakeRtt = await wakeRoundTrip();
  const catalog = benchCatalog();
  // `gateway_2p`: the same gateway as two API processes sharing its port (API_PROCESSES=2).
  const stack = await startStack({ CATALOG_PATH: catalog }, { gateways: { gateway: {}, gateway_2p: { API_PROCESSES: '2' } } });
  const portkey = await startPortkey();
  stack.processes.portkey = portkey.process;
  const floors = { node: await startFloor('node', stack.sandboxUrl), koa: await startFloor('koa', stack.sandboxUrl) };
  stack.processes.floor_node = floors.node.process;
  stack.processes.floor_koa = floors.koa.process;
  try {
    const key = await benchKey(stack);
    const portkeyHeaders = (faults: string) => ({
      authorization: 'Bearer sk-bench',
      'x-portkey-provider': 'openai',
      'x-portkey-custom-host': `${stack.sandboxUrl}/${faults}openai/v1`,
    });
    const auth = { authorization: `Bearer ${key}` };
    /** A floor forwarder's chat URL, with the sandbox's fault spec (`~…/`) passed through. */
    const floorUrl = (kind: keyof typeof floors, faults: string) => `${floors[kind].url}/${faults}openai/v1/chat/completions`;
    const chatUrl = `${stack.gatewayUrl}/api/v1/chat/completions`;
    const messagesUrl = `${stack.gatewayUrl}/api/v1/messages`;
    const targets: Record<TargetName, Target> = {
      direct: { url: `${stack.sandboxUrl}/openai/v1/chat/completions`, headers: {}, model: 'bench-model' },
      gateway: { url: chatUrl, headers: auth, model: 'bench/chat' },
      gateway_2p: { url: `${stack.gatewayUrls.gateway_2p}/api/v1/chat/completions`, headers: auth, model: 'bench/chat' },
      portkey: { url: `${portkey.url}/v1/chat/completions`, headers: portkeyHeaders(''), model: 'bench-model' },
      floor_node: { url: floorUrl('node', ''), headers: {}, model: 'bench-model' },
      floor_koa: { url: floorUrl('koa', ''), headers: {}, model: 'bench-model' },
      // The Anthropic side: the provider alone, the gateway untranslated, and both translations.
      direct_messages: { url: `${stack.sandboxUrl}/anthropic/v1/messages`, headers: {}, model: 'bench-model', api: 'messages' },
      gateway_messages: { url: messagesUrl, headers: auth, model: 'bench/claude', api: 'messages' },
      chat_to_messages: { url: chatUrl, headers: auth, model: 'bench/claude' },
      messages_to_chat: { url: messagesUrl, headers: auth, model: 'bench/chat', api: 'messages' },
    };
    const warmStreams: Record<TargetName, Target> = {
      direct: { ...targets.direct, url: `${stack.sandboxUrl}/~max_words=${WARM_UP.streamWords}/openai/v1/chat/completions` },
      gateway: { ...targets.gateway, model: 'bench/stream-warm' },
      gateway_2p: { ...targets.gateway_2p, model: 'bench/stream-warm' },
      portkey: { ...targets.portkey, headers: portkeyHeaders(`~max_words=${WARM_UP.streamWords}/`) },
      floor_node: { ...targets.floor_node, url: floorUrl('node', `~max_words=${WARM_UP.streamWords}/`) },
      floor_koa: { ...targets.floor_koa, url: floorUrl('koa', `~max_words=${WARM_UP.streamWords}/`) },
      direct_messages: { ...targets.direct_messages, url: `${stack.sandboxUrl}/~max_words=${WARM_UP.streamWords}/anthropic/v1/messages` },
      gateway_messages: { ...targets.gateway_messages, model: 'bench/claude-stream-warm' },
      chat_to_messages: { ...targets.chat_to_messages, model: 'bench/claude-stream-warm' },
      messages_to_chat: { ...targets.messages_to_chat, model: 'bench/stream-warm' },
    };
    for (const name of Object.keys(targets) as (keyof typeof targets)[]) {
      const t = targets[name];
      const n = PROCESSES[name] ?? 1;
      const w = warmStreams[name];
      for (let round = 0; round < WARM_UP.rounds; round++) {
        await closedLoop(t.url, { ...body, model: t.model }, t.headers, n * WARM_UP.concurrency, (n * WARM_UP.requests) / WARM_UP.rounds);
        await closedLoop(
          w.url,
          { ...body, model: w.model, stream: true },
          w.headers,
          n * WARM_UP.streamConcurrency,
          (n * WARM_UP.streams) / WARM_UP.rounds,
        );
      }
    }

    const rows: Record<string, any>[] = [];
    for (const concurrency of levels) {
      const row: Record<string, any> = {
        concurrency,
        ...(await measuredInRounds(
          stack,
          Object.fromEntries(
            Object.entries(targets).map(([name, t]) => [
              name,
              {
                ...t,
                body: { ...body, model: t.model },
                requests: TOTALS[concurrency] ?? 2000,
                ok: (text: string) => text.includes(answered(t)),
              },
            ]),
          ),
          concurrency,
          ROUNDS,
        )),
      };
      for (const [name, base] of Object.entries(BASELINE)) row[`${name}_added_p50_ms`] = round2(row[name].p50_ms - row[base].p50_ms);
      rows.push(row);
    }

    const paced = `~max_words=${STREAM_WORDS},chunk_delay=${STREAM_GAP_MS}/`;
    const streamTargets: Record<TargetName, Target> = {
      direct: { ...targets.direct, url: `${stack.sandboxUrl}/${paced}openai/v1/chat/completions` },
      gateway: { ...targets.gateway, model: 'bench/stream' },
      gateway_2p: { ...targets.gateway_2p, model: 'bench/stream' },
      portkey: { ...targets.portkey, headers: portkeyHeaders(paced) },
      floor_node: { ...targets.floor_node, url: floorUrl('node', paced) },
      floor_koa: { ...targets.floor_koa, url: floorUrl('koa', paced) },
      direct_messages: { ...targets.direct_messages, url: `${stack.sandboxUrl}/${paced}anthropic/v1/messages` },
      gateway_messages: { ...targets.gateway_messages, model: 'bench/claude-stream' },
      chat_to_messages: { ...targets.chat_to_messages, model: 'bench/claude-stream' },
      messages_to_chat: { ...targets.messages_to_chat, model: 'bench/stream' },
    };
    const streams: Record<string, any> = await streamed(streamTargets, warmStreams);
    for (const [name, base] of Object.entries(BASELINE))
      streams[`${name}_added_ttft_p50_ms`] = round2(streams[name].ttft_p50_ms - streams[base].ttft_p50_ms);

    const at = (c: number) => rows.find((r) => r.concurrency === c);
    const c1 = at(1);
    const c50 = at(50);
    const c200 = at(200);
    const verdicts = {
      added_p50_at_c1: c1 && c1.gateway_added_p50_ms <= BARS.added_p50_ms_at_c1,
      added_p50_share_of_portkey: c1 && c1.gateway_added_p50_ms <= c1.portkey_added_p50_ms * BARS.added_p50_share_of_portkey,
      rps_at_c50_times_portkey: c50 && c50.gateway.rps >= c50.portkey.rps * BARS.rps_at_c50_times_portkey && c50.gateway.errors === 0,
      p99_at_c200: c200 && c200.gateway.p99_ms <= BARS.max_p99_ms_at_c200 && c200.gateway.errors === 0,
      // What `npm start` runs on this 2-core machine (API_PROCESSES defaults to one per core).
      p99_at_c200_two_processes: c200 && c200.gateway_2p.p99_ms <= BARS.max_p99_ms_at_c200 && c200.gateway_2p.errors === 0,
      rps_at_c50_times_portkey_two_processes:
        c50 && c50.gateway_2p.rps >= c50.portkey.rps * BARS.rps_at_c50_times_portkey && c50.gateway_2p.errors === 0,
      added_ttft_p50: streams.gateway_added_ttft_p50_ms <= BARS.added_ttft_p50_ms,
      no_chunk_held_back: streams.gateway.events_per_read <= streams.direct.events_per_read * 1.1,
      // Translation costs at most 0.1 ms of added p50 at c=1 over the untranslated call of the same API.
      translated_added_p50_at_c1:
        c1 &&
        c1.chat_to_messages_added_p50_ms <= c1.gateway_added_p50_ms + BARS.translated_extra_p50_ms &&
        c1.messages_to_chat_added_p50_ms <= c1.gateway_messages_added_p50_ms + BARS.translated_extra_p50_ms,
      translated_added_ttft_p50:
        streams.chat_to_messages_added_ttft_p50_ms <= BARS.added_ttft_p50_ms &&
        streams.messages_to_chat_added_ttft_p50_ms <= BARS.added_ttft_p50_ms,
    };
    const result = {
      benchmark: 'proxy',
      at: new Date().toISOString(),
      machine: { cpus: os.cpus().length, node: process.version, wake_round_trip: wakeRtt },
      bars: BARS,
      verdicts,
      rows,
      streams: { words: STREAM_WORDS, gap_ms: STREAM_GAP_MS, ...streams },
    };
    const file = writeResult('proxy', result);
    const procs = ['gateway', 'gateway_2p', 'portkey', 'floor_node', 'floor_koa', 'ferretdb', 'sandbox'];
    const cpu = (r: MeasuredRow) => procs.map((n) => r.cpu_ms_per_request[n]).join(' / ');
    console.log(`\n   c | target   | req/s   | p50 / p99 ms    | added p50 | errors | CPU ms/req: ${procs.join(' / ')}`);
    for (const r of rows) {
      for (const name of Object.keys(targets)) {
        const x = r[name] as MeasuredRow;
        const added = String(r[`${name}_added_p50_ms`] ?? '');
        console.log(
          `${String(r.concurrency).padStart(4)} | ${name.padEnd(16)} | ${String(x.rps).padEnd(7)} | ${`${x.p50_ms} / ${x.p99_ms}`.padEnd(15)} | ${added.padEnd(9)} | ${String(x.errors).padEnd(6)} | ${cpu(x)}`,
        );
      }
    }
    console.log(
      `\nstreamed (${STREAM_WORDS} tokens, one per ${STREAM_GAP_MS} ms): target | TTFT p50 / p90 ms | tokens/s p50 | events per read`,
    );
    for (const name of Object.keys(targets)) {
      const s = streams[name] as StreamStats;
      console.log(
        `${name.padEnd(16)} | ${s.ttft_p50_ms} / ${s.ttft_p90_ms} | ${s.tokens_per_s_p50} | ${s.events_per_read} (errors ${s.errors}${s.first_error ? `: ${s.first_error}` : ''})`,
      );
    }
    console.log(`verdicts: ${JSON.stringify(verdicts)}`);
    console.log(`results: ${file}`);
    return result;
  } finally {
    await stack.stop();
    fs.rmSync(catalog, { force: true });
  }
}
