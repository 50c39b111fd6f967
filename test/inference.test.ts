// The synchronous inference routes against the real stack: the four shapes, streamed and not,
// fallbacks before the first byte, failures after it, client disconnects, presets, billing.
import http from 'node:http';
import { expect } from 'chai';
import { endpointEntry, modelEntry, providerEntry } from '../domain/catalog/entries';
import { stack } from './fixture';
import {
  clearOfWindowEdge,
  call,
  createTenant,
  expectJsonAnswerHeaders,
  startTestGateway,
  uniqueName,
  writeTestCatalog,
  type Tenant,
  type TestGateway,
  storedUsage,
  waitForStatus,
  billedBatchLine,
} from './helpers';
import { parseSse, streamCall } from './inference-helpers';

const run = uniqueName('inf'); // isolates this file's sandbox counters

function provider(slug: string, faults: string, adapter: 'openai' | 'anthropic' = 'openai') {
  const url = `\${SANDBOX_URL}/~run=${run}${faults ? `,${faults}` : ''}/${adapter}${adapter === 'openai' ? '/v1' : ''}`;
  return providerEntry(slug, url, { adapter });
}

function endpoint(slug: string, prompt = 1) {
  return endpointEntry(slug, prompt, { pricing: { prompt, completion: prompt * 4 }, supported_parameters: ['temperature', 'max_tokens'] });
}

function model(id: string, endpoints: ReturnType<typeof endpoint>[]) {
  return modelEntry(id, endpoints, { released: '20260301' });
}

/** Direct calls to the sandbox: what the provider says when asked the same thing. */
async function direct(path: string, body: unknown) {
  const res = await fetch(`${stack.sandboxUrl}/~run=${run}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return (await res.json()) as any;
}

async function sandboxCount(what: '_calls' | '_aborted' | '_streamed', spec: string, path: string): Promise<number> {
  const counts = (await (await fetch(`${stack.sandboxUrl}/${what}`)).json()) as Record<string, number>;
  return counts[`${spec}|${path}`] ?? 0;
}

const CHAT = '/openai/v1/chat/completions';
const MESSAGES = '/anthropic/v1/messages';
const RESPONSES = '/openai/v1/responses';

describe('inference routes', function () {
  this.timeout(60_000);
  let gw: TestGateway;
  let t: Tenant;
  const url = (path: string) => `${gw.url}/api/v1${path}`;
  const post = (path: string, body: unknown, key = t.inferenceKey) => call(url(path), { key, body });
  const generation = async (id: string) => (await call(url(`/generation?id=${id}`), { key: t.inferenceKey })).body.data;

  before(async () => {
    const catalog = writeTestCatalog('inference', (c) => {
      c.providers.push(
        provider('good', ''),
        provider('good-claude', '', 'anthropic'),
        provider('broken', 'status=500'),
        provider('broken-claude', 'status=500', 'anthropic'),
        provider('midfail', 'fail_after=3,max_words=40'),
        provider('midfail-claude', 'fail_after=3,max_words=40', 'anthropic'),
        provider('slow', 'chunk_delay=40,max_words=200'),
        provider('silent', 'latency=500'),
        provider('good2', ''),
        provider('big', 'max_words=150000'),
        // Over and under UPSTREAM_MAX_ANSWER_BYTES (2 MB here): a padding field, or a comment before a stream's first event.
        provider('bloated', 'pad=3000000'),
        provider('padded', 'pad=500000'),
      );
      c.models.push(
        model('test/fallback', [endpoint('broken', 0.1), endpoint('good', 1)]),
        model('test/fallback-claude', [endpoint('broken-claude', 0.1), endpoint('good-claude', 1)]),
        model('test/dead', [endpoint('broken')]),
        model('test/midfail', [endpoint('midfail'), endpoint('midfail-claude')]),
        model('test/slow', [endpoint('slow')]),
        model('test/silent', [endpoint('silent')]),
        model('test/good', [endpoint('good'), endpoint('good-claude')]),
        model('test/pair', [endpoint('good', 1), endpoint('good2', 2)]),
        model('test/big', [{ ...endpoint('big'), pricing: { prompt: 0.01, completion: 0.01 } }]),
        model('test/bloated', [endpoint('bloated', 0.1), endpoint('padded', 1)]),
        // Standard endpoints, and one per provider tier at its own prices (twice, six times, and half).
        model('test/tiered', [
          endpoint('good', 1),
          { ...endpoint('good', 2), variant: 'priority', service_tier: 'priority' } as ReturnType<typeof endpoint>,
          endpoint('good-claude', 1),
          { ...endpoint('good-claude', 6), variant: 'fast', service_tier: 'fast' } as ReturnType<typeof endpoint>,
          { ...endpoint('good', 0.5), variant: 'flex', service_tier: 'flex' } as ReturnType<typeof endpoint>,
        ]),
        // A standard endpoint that always fails, and a priority one: served only by a call that opts in to it.
        model('test/opt-in', [
          endpoint('broken', 1),
          { ...endpoint('good', 2), variant: 'priority', service_tier: 'priority' } as ReturnType<typeof endpoint>,
        ]),
      );
    });
    gw = await startTestGateway({
      env: { CATALOG_PATH: catalog, UPSTREAM_MAX_ANSWER_BYTES: '2mb' },
      tune: (c) => (c.inference.keepAliveMs = 100),
    });
    t = await createTenant(gw.store, 50);
  });
  after(async () => {
    await gw.stop();
  });

  describe('answers in one piece', () => {
    it('chat completions: our generation id, the dated model id, the provider, and the usage the provider reported, with its cost', async () => {
      const body = { model: 'test/good', messages: [{ role: 'user', content: 'Say something' }], max_tokens: 8 };
      const r = await post('/chat/completions', { ...body, provider: { only: ['good'] } }); // native (translation: translation.test.ts)
      expect(r.status, JSON.stringify(r.body)).to.equal(200);
      expect(r.body.id).to.match(/^gen-/);
      expect(r.headers.get('x-generation-id')).to.equal(r.body.id);
      expectJsonAnswerHeaders(r);
      expect(r.body).to.include({ object: 'chat.completion', model: 'test/good-20260301', provider: 'good' });
      const upstream = await direct(CHAT, { messages: body.messages, max_tokens: 8, model: 'good-model' });
      expect(r.body.choices).to.deep.equal(upstream.choices);
      expect(r.body.usage).to.deep.equal({ ...upstream.usage, cost: r.body.usage.cost });
      const expectedCost = (upstream.usage.prompt_tokens * 1 + upstream.usage.completion_tokens * 4) / 1e6;
      expect(r.body.usage.cost).to.be.closeTo(expectedCost, 1e-12);
      const g = await generation(r.body.id);
      expect(g).to.include({
        id: r.body.id,
        model: 'test/good-20260301',
        provider_name: 'good',
        tokens_prompt: upstream.usage.prompt_tokens,
        tokens_completion: upstream.usage.completion_tokens,
      });
      expect(g.total_cost).to.be.closeTo(expectedCost, 1e-12);
    });

    it('messages (Anthropic shape), authenticated by x-api-key as Anthropic clients send it', async () => {
      const body = { model: 'test/good', max_tokens: 6, system: 'Be brief.', messages: [{ role: 'user', content: 'Hello' }] };
      const res = await fetch(url('/messages'), {
        method: 'POST',
        headers: { 'x-api-key': t.inferenceKey, 'anthropic-version': '2023-06-01', 'content-type': 'application/json' },
        body: JSON.stringify({ ...body, provider: { only: ['good-claude'] } }),
      });
      const r = (await res.json()) as any;
      expect(res.status, JSON.stringify(r)).to.equal(200);
      const upstream = await direct(MESSAGES, { ...body, model: 'good-claude-model' });
      expect(r).to.include({ type: 'message', role: 'assistant', model: 'test/good-20260301', provider: 'good-claude' });
      expect(r.content).to.deep.equal(upstream.content);
      expect(r.usage).to.deep.include(upstream.usage);
      expect((await generation(r.id)).tokens_completion).to.equal(upstream.usage.output_tokens);
    });

    it('responses (OpenAI Responses shape)', async () => {
      const r = await post('/responses', { model: 'test/good', input: 'Write a line', max_output_tokens: 5, provider: { only: ['good'] } });
      expect(r.status, JSON.stringify(r.body)).to.equal(200);
      const upstream = await direct(RESPONSES, { input: 'Write a line', max_output_tokens: 5, model: 'good-model' });
      expect(r.body).to.include({ object: 'response', status: 'completed', model: 'test/good-20260301', provider: 'good' });
      expect(r.body.output).to.deep.equal(upstream.output);
      expect(r.body.usage).to.include(upstream.usage);
    });

    it('embeddings', async () => {
      const r = await post('/embeddings', { model: 'sandbox/embed-1', input: ['one', 'two'], dimensions: 4 });
      expect(r.status, JSON.stringify(r.body)).to.equal(200);
      expect(r.body).to.include({ object: 'list', model: 'sandbox/embed-1-20261015' });
      expect(r.body.data).to.have.length(2);
      expect(r.body.data[0].embedding).to.have.length(4);
      expect(r.body.usage.cost).to.be.greaterThan(0);
      expect((await generation(r.body.id)).tokens_prompt).to.equal(r.body.usage.prompt_tokens);
    });
  });

  describe('streams', () => {
    it('chat: chunks naming us, usage with cost in the last chunk when asked, then [DONE]; billed what the provider reported', async () => {
      const body = { model: 'test/good', messages: [{ role: 'user', content: 'Stream please' }], max_tokens: 10, stream: true };
      const only = { provider: { only: ['good'] } };
      const r = await streamCall(url('/chat/completions'), t.inferenceKey, { ...body, ...only, stream_options: { include_usage: true } });
      expect(r.status).to.equal(200);
      expect(r.headers.get('content-type')).to.match(/^text\/event-stream/);
      const id = r.headers.get('x-generation-id')!;
      expect(r.events.at(-1)!.data).to.equal('[DONE]');
      const chunks = r.events.slice(0, -1).map((e) => e.json);
      for (const c of chunks) expect(c).to.include({ id, object: 'chat.completion.chunk', model: 'test/good-20260301', provider: 'good' });
      const text = chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('');
      const upstream = await direct(CHAT, { messages: body.messages, max_tokens: 10, model: 'good-model' });
      expect(text).to.equal(upstream.choices[0].message.content);
      const last = chunks.at(-1);
      expect(last.choices).to.deep.equal([]);
      expect(last.usage).to.include(upstream.usage);
      expect(last.usage.cost).to.be.greaterThan(0);
      const g = await generation(id);
      expect(g).to.include({ tokens_prompt: upstream.usage.prompt_tokens, tokens_completion: upstream.usage.completion_tokens });

      // Not asked for: no usage chunk (the gateway still asks the provider, to bill).
      const plain = await streamCall(url('/chat/completions'), t.inferenceKey, { ...body, ...only });
      expect(plain.events.some((e) => e.json?.usage)).to.equal(false);
      expect((await generation(plain.headers.get('x-generation-id')!)).tokens_completion).to.equal(upstream.usage.completion_tokens);
      // OpenRouter's form of the same request.
      const or = await streamCall(url('/chat/completions'), t.inferenceKey, { ...body, ...only, usage: { include: true } });
      expect(or.events.at(-2)!.json.usage).to.include(upstream.usage);
    });

    it("messages: Anthropic's typed events, message_start naming us, usage in message_delta", async () => {
      const body = { model: 'test/good', max_tokens: 7, messages: [{ role: 'user', content: 'Stream' }], stream: true };
      const r = await streamCall(url('/messages'), t.inferenceKey, { ...body, provider: { only: ['good-claude'] } });
      expect(r.status).to.equal(200);
      const types = r.events.map((e) => e.event);
      expect(types[0]).to.equal('message_start');
      expect(types.at(-1)).to.equal('message_stop');
      expect(types).to.include.members(['content_block_start', 'content_block_delta', 'content_block_stop', 'message_delta']);
      for (const e of r.events) expect(e.json.type).to.equal(e.event);
      const start = r.events[0].json.message;
      expect(start).to.include({ id: r.headers.get('x-generation-id'), model: 'test/good-20260301', provider: 'good-claude' });
      const upstream = await direct(MESSAGES, { ...body, stream: undefined, model: 'good-claude-model' });
      const text = r.events
        .filter((e) => e.event === 'content_block_delta')
        .map((e) => e.json.delta.text)
        .join('');
      expect(text).to.equal(upstream.content[0].text);
      const delta = r.events.find((e) => e.event === 'message_delta')!.json;
      expect(delta.usage.output_tokens).to.equal(upstream.usage.output_tokens);
      const g = await generation(start.id);
      expect(g).to.include({ tokens_prompt: upstream.usage.input_tokens, tokens_completion: upstream.usage.output_tokens });
    });

    it('responses: typed, numbered events, the completed response naming us with usage and cost', async () => {
      const r = await streamCall(url('/responses'), t.inferenceKey, {
        model: 'test/good',
        input: 'Go',
        stream: true,
        provider: { only: ['good'] },
      });
      expect(r.status).to.equal(200);
      const types = r.events.map((e) => e.event);
      expect(types[0]).to.equal('response.created');
      expect(types.at(-1)).to.equal('response.completed');
      expect(r.events.map((e) => e.json.sequence_number)).to.deep.equal(r.events.map((_, i) => i));
      const done = r.events.at(-1)!.json.response;
      expect(done).to.include({ id: r.headers.get('x-generation-id'), model: 'test/good-20260301', provider: 'good', status: 'completed' });
      expect(done.usage.cost).to.be.greaterThan(0);
      expect((await generation(done.id)).tokens_completion).to.equal(done.usage.output_tokens);
    });

    it('sends keep-alive comments while the provider is silent', async () => {
      const r = await streamCall(url('/chat/completions'), t.inferenceKey, {
        model: 'test/silent',
        messages: [{ role: 'user', content: 'wait for it' }],
        stream: true,
      });
      expect(r.status).to.equal(200);
      expect(r.comments.filter((c) => c === ': keep-alive').length).to.be.greaterThan(1);
      expect(r.text.indexOf(': keep-alive')).to.be.lessThan(r.text.indexOf('data: '));
      expect(r.events.at(-1)!.data).to.equal('[DONE]');
    });
  });

  describe('fallbacks and failures', () => {
    it('falls back to the next endpoint on a 500 before the first byte, streamed or not', async () => {
      const body = { model: 'test/fallback', messages: [{ role: 'user', content: 'hi' }], provider: { order: ['broken', 'good'] } };
      const before = await sandboxCount('_calls', `run=${run},status=500`, CHAT);
      const r = await post('/chat/completions', body);
      expect(r.status, JSON.stringify(r.body)).to.equal(200);
      expect(r.body.provider).to.equal('good');
      const s = await streamCall(url('/chat/completions'), t.inferenceKey, { ...body, stream: true });
      expect(s.status).to.equal(200);
      expect(s.events[0].json.provider).to.equal('good');
      expect(s.events.at(-1)!.data).to.equal('[DONE]');
      const m = await streamCall(url('/messages'), t.inferenceKey, {
        model: 'test/fallback-claude',
        max_tokens: 5,
        messages: [{ role: 'user', content: 'hi' }],
        provider: { order: ['broken-claude', 'good-claude'] },
        stream: true,
      });
      expect(m.events[0].json.message.provider).to.equal('good-claude');
      expect(await sandboxCount('_calls', `run=${run},status=500`, CHAT)).to.equal(before + 2);
    });

    it('an answer (or an event of a stream) over UPSTREAM_MAX_ANSWER_BYTES is a failure of its provider: the next one answers, or a 502 says why', async () => {
      const ask = { model: 'test/bloated', messages: [{ role: 'user', content: 'hi' }], max_tokens: 5 };
      const only = { provider: { only: ['bloated'] } };
      const refused = await post('/chat/completions', { ...ask, ...only });
      expect(refused.status, JSON.stringify(refused.body)).to.equal(502);
      expect(refused.body.error.message).to.include('Provider sent an answer over 2 MB');
      expect(refused.body.error.metadata.provider_name).to.equal('bloated');
      const refusedStream = await streamCall(url('/chat/completions'), t.inferenceKey, { ...ask, ...only, stream: true });
      expect(refusedStream.text).to.include('Provider sent an answer over 2 MB');
      // Keep-alives every 50 ms here: when 2 MB took longer than that to arrive (a busy machine),
      // they started the answer, and the failure is its last event instead of a 502.
      if (refusedStream.status === 200) {
        expect(refusedStream.text.startsWith(': keep-alive')).to.equal(true);
        expect(refusedStream.events.at(-1)!.data).to.equal('[DONE]');
        const failed = refusedStream.events.at(-2)!.json;
        expect(failed.choices[0].finish_reason).to.equal('error');
        expect(failed.error.message).to.include('Provider sent an answer over 2 MB');
      } else expect(refusedStream.status).to.equal(502);
      // Past the broken provider, the one under the bound answers.
      const inOrder = { ...ask, provider: { order: ['bloated', 'padded'] } };
      const before = await sandboxCount('_calls', `pad=3000000,run=${run}`, CHAT);
      for (const stream of [false, true]) {
        const r = stream
          ? await streamCall(url('/chat/completions'), t.inferenceKey, { ...inOrder, stream })
          : await post('/chat/completions', inOrder);
        expect(r.status).to.equal(200);
        const served = stream ? (r as Awaited<ReturnType<typeof streamCall>>).events[0].json.provider : (r as { body: any }).body.provider;
        expect(served).to.equal('padded');
      }
      expect(await sandboxCount('_calls', `pad=3000000,run=${run}`, CHAT)).to.equal(before + 2);
    });

    it('without allow_fallbacks, the failure is the answer, in the error envelope', async () => {
      const r = await post('/chat/completions', {
        model: 'test/fallback',
        messages: [{ role: 'user', content: 'hi' }],
        provider: { order: ['broken'], allow_fallbacks: false },
      });
      expect(r.status).to.equal(502);
      expect(r.body.error).to.include({ code: 502 });
      expect(r.body.error.metadata.provider_name).to.equal('broken');
    });

    it('tries the `models` list in order and answers with the model that served', async () => {
      const r = await post('/chat/completions', { model: 'test/dead', models: ['test/good'], messages: [{ role: 'user', content: 'x' }] });
      expect(r.status, JSON.stringify(r.body)).to.equal(200);
      expect(r.body.model).to.equal('test/good-20260301');
      const only = await post('/chat/completions', { models: ['test/dead', 'test/good'], messages: [{ role: 'user', content: 'x' }] });
      expect(only.body.model).to.equal('test/good-20260301');
      const s = await streamCall(url('/chat/completions'), t.inferenceKey, {
        model: 'test/dead',
        models: ['test/good'],
        messages: [{ role: 'user', content: 'x' }],
        stream: true,
      });
      expect(s.events[0].json.model).to.equal('test/good-20260301');
    });

    it('a provider failing mid-stream ends the stream with an error in its format; the partial is billed', async () => {
      const body = { model: 'test/midfail', messages: [{ role: 'user', content: 'go on' }], max_tokens: 40, stream: true };
      const r = await streamCall(url('/chat/completions'), t.inferenceKey, body);
      expect(r.status).to.equal(200);
      const content = r.events.filter((e) => e.json?.choices?.[0]?.delta?.content);
      expect(content).to.have.length(3);
      const err = r.events.at(-2)!.json;
      expect(err.error.code).to.equal(502);
      expect(err.choices[0].finish_reason).to.equal('error');
      expect(r.events.at(-1)!.data).to.equal('[DONE]');
      const g = await generation(r.headers.get('x-generation-id')!);
      expect(g.tokens_completion).to.equal(3);
      expect(g.tokens_prompt).to.be.greaterThan(0);
      expect(g.total_cost).to.be.greaterThan(0);

      const m = await streamCall(url('/messages'), t.inferenceKey, {
        model: 'test/midfail',
        max_tokens: 40,
        messages: [{ role: 'user', content: 'go on' }],
        stream: true,
      });
      expect(m.events.at(-1)!.event).to.equal('error');
      expect(m.events.at(-1)!.json).to.deep.include({ type: 'error' });
      expect(m.events.at(-1)!.json.error.type).to.equal('api_error');
      const mg = await generation(m.events[0].json.message.id);
      // Anthropic reported the prompt at message_start; the output is what arrived.
      expect(mg.tokens_completion).to.equal(3);
      expect(mg.tokens_prompt).to.equal(m.events[0].json.message.usage.input_tokens);
    });

    it('a client that goes away mid-stream aborts the upstream call and is billed once for what was produced', async () => {
      const spec = `chunk_delay=40,max_words=200,run=${run}`;
      const abortedBefore = await sandboxCount('_aborted', spec, CHAT);
      const controller = new AbortController();
      const res = await fetch(url('/chat/completions'), {
        method: 'POST',
        headers: { authorization: `Bearer ${t.inferenceKey}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'test/slow', messages: [{ role: 'user', content: 'long one' }], max_tokens: 200, stream: true }),
        signal: controller.signal,
      });
      const id = res.headers.get('x-generation-id')!;
      const reader = res.body!.getReader();
      let seen = '';
      while ((seen.match(/"content":"[^"]+"/g) ?? []).length < 3) seen += new TextDecoder().decode((await reader.read()).value);
      controller.abort();
      let g: any = null;
      for (let i = 0; i < 100 && !g; i++) {
        g = (await call(url(`/generation?id=${id}`), { key: t.inferenceKey })).body.data ?? null;
        if (!g) await new Promise((r) => setTimeout(r, 50));
      }
      expect(g, 'usage recorded').to.not.equal(null);
      expect(g.tokens_completion).to.be.within(3, 199);
      expect(await sandboxCount('_aborted', spec, CHAT)).to.equal(abortedBefore + 1);
      await gw.usage.flushed();
      expect(await gw.store.usage.countDocuments({ _id: id })).to.equal(1);
    });
  });

  describe('a client that hangs up', () => {
    it('on a keep-alive connection that served calls before, cancels its answer-in-one-piece call upstream and is not billed', async () => {
      const tenant = await createTenant(gw.store, 5);
      const spec = `latency=500,run=${run}`; // the sandbox sorts a spec's parts
      const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
      const send = (model: string) =>
        http.request(url('/chat/completions'), {
          method: 'POST',
          agent,
          headers: { authorization: `Bearer ${tenant.inferenceKey}`, 'content-type': 'application/json' },
        });
      const body = (model: string) => JSON.stringify({ model, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4 });
      try {
        const reused: boolean[] = [];
        for (let i = 0; i < 3; i++) {
          const req = send('test/good');
          const res = await new Promise<http.IncomingMessage>((resolve, reject) =>
            req.on('response', resolve).on('error', reject).end(body('test/good')),
          );
          res.resume();
          await new Promise((r) => res.on('end', r));
          expect(res.statusCode).to.equal(200);
          reused.push(req.reusedSocket);
        }
        expect(reused, 'one connection carried the calls').to.deep.equal([false, true, true]);
        const [calls, aborted] = [await sandboxCount('_calls', spec, CHAT), await sandboxCount('_aborted', spec, CHAT)];
        const req = send('test/silent');
        const failed = new Promise((resolve) => req.on('error', resolve).on('response', resolve));
        req.end(body('test/silent'));
        expect(req.reusedSocket, 'the slow call went on the same connection').to.equal(true);
        for (let i = 0; i < 400 && (await sandboxCount('_calls', spec, CHAT)) === calls; i++) await new Promise((r) => setTimeout(r, 5));
        req.destroy();
        await failed;
        let seen = aborted;
        for (let i = 0; i < 100 && seen === aborted; i++) {
          await new Promise((r) => setTimeout(r, 20));
          seen = await sandboxCount('_aborted', spec, CHAT);
        }
        // Seen by the sandbox before its 500 ms answer: the gateway hung up on it.
        expect(seen).to.equal(aborted + 1);
        await gw.usage.flushed();
        const billed = await storedUsage(gw.store, { workspace_id: tenant.workspaceId });
        expect(billed.map((u) => u.model)).to.deep.equal(['test/good-20260301', 'test/good-20260301', 'test/good-20260301']);
      } finally {
        agent.destroy();
      }
    });
  });

  describe('presets', () => {
    it('applies the preset in each shape: its system prompt first, its parameters as defaults the request overrides, its provider order', async () => {
      const created = await call(url('/presets/terse/messages'), {
        key: t.managementKey,
        body: { model: 'test/pair', system: 'Be terse.', temperature: 0.3, max_tokens: 7, provider: { order: ['good2'] } },
      });
      expect(created.status, JSON.stringify(created.body)).to.equal(200);
      const user = [{ role: 'user', content: 'Hi' }];

      // Chat: the request's max_tokens wins; the preset's provider order picks the dearer endpoint.
      const chat = await post('/chat/completions', { model: '@preset/terse', messages: user, max_tokens: 5 });
      expect(chat.status, JSON.stringify(chat.body)).to.equal(200);
      expect(chat.body).to.include({ model: 'test/pair-20260301', provider: 'good2' });
      const chatUpstream = await direct(CHAT, {
        model: 'good2-model',
        messages: [{ role: 'system', content: 'Be terse.' }, ...user],
        temperature: 0.3,
        max_tokens: 5,
      });
      expect(chat.body.choices).to.deep.equal(chatUpstream.choices);

      // Messages: another model beside the preset; the preset's system block comes first, its max_tokens applies.
      const messages = await post('/messages', {
        model: 'test/good@preset/terse',
        system: 'Also polite.',
        messages: user,
        provider: { only: ['good-claude'] },
      });
      expect(messages.status, JSON.stringify(messages.body)).to.equal(200);
      expect(messages.body).to.include({ model: 'test/good-20260301', provider: 'good-claude' });
      const messagesUpstream = await direct(MESSAGES, {
        model: 'good-claude-model',
        system: [
          { type: 'text', text: 'Be terse.' },
          { type: 'text', text: 'Also polite.' },
        ],
        messages: user,
        temperature: 0.3,
        max_tokens: 7,
      });
      expect(messages.body.content).to.deep.equal(messagesUpstream.content);
      expect(messages.body.usage.output_tokens).to.equal(messagesUpstream.usage.output_tokens);

      // Responses, streamed: instructions after the preset's system prompt, its cap as max_output_tokens.
      const responses = await streamCall(url('/responses'), t.inferenceKey, {
        preset: 'terse',
        input: 'Hi',
        instructions: 'In French.',
        stream: true,
      });
      expect(responses.status).to.equal(200);
      const completed = responses.events.find((e) => e.json?.type === 'response.completed')!.json.response;
      expect(completed).to.include({ model: 'test/pair-20260301', provider: 'good2' });
      const responsesUpstream = await direct(RESPONSES, {
        model: 'good2-model',
        input: 'Hi',
        instructions: 'Be terse.\n\nIn French.',
        temperature: 0.3,
        max_output_tokens: 7,
      });
      expect(completed.output).to.deep.equal(responsesUpstream.output);
    });

    it('a preset the workspace does not have is a 404 naming it', async () => {
      const missing = await post('/chat/completions', { model: '@preset/never-made', messages: [{ role: 'user', content: 'x' }] });
      expect(missing.status).to.equal(404);
      expect(missing.body.error.code).to.equal(404);
      expect(missing.body.error.message).to.match(/never-made/);
    });
  });

  describe('backpressure', () => {
    it('a client that stops reading stalls the provider instead of filling the gateway; the stream then completes', async () => {
      const spec = `max_words=150000,run=${run}`;
      const body = JSON.stringify({
        model: 'test/big',
        messages: [{ role: 'user', content: 'everything' }],
        max_tokens: 150000,
        stream: true,
      });
      const target = new URL(url('/chat/completions'));
      const chunks: Buffer[] = [];
      const res = await new Promise<http.IncomingMessage>((resolve, reject) => {
        const req = http.request(target, {
          method: 'POST',
          headers: { authorization: `Bearer ${t.inferenceKey}`, 'content-type': 'application/json' },
        });
        req.on('response', resolve).on('error', reject);
        req.end(body);
      });
      expect(res.statusCode).to.equal(200);
      const ended = new Promise<void>((resolve) => res.on('end', resolve));
      res.on('data', (c: Buffer) => chunks.push(c));
      await new Promise((r) => res.once('data', r));
      res.pause();
      // Wait until the provider has stopped being read (its count holds still), then look at how far it got.
      let last = -1;
      let still = 0;
      while (still < 5) {
        await new Promise((r) => setTimeout(r, 100));
        const now = await sandboxCount('_streamed', spec, CHAT);
        still = now === last ? still + 1 : 0;
        last = now;
      }
      expect(last, 'events the provider wrote while the client was paused').to.be.greaterThan(0).and.below(75_000);
      res.resume();
      await ended;
      const { events } = parseSse(Buffer.concat(chunks).toString());
      expect(events.at(-1)!.data).to.equal('[DONE]');
      const words = events.filter((e) => e.json?.choices?.[0]?.delta?.content).length;
      expect(words).to.equal(150000);
      expect(await sandboxCount('_streamed', spec, CHAT)).to.be.greaterThan(150000);
    });
  });

  describe('rate limits', () => {
    it('429 in the envelope with Retry-After past the limit, streamed or not', async () => {
      await clearOfWindowEdge();
      const limited = await startTestGateway({ withWorker: false, env: { RATE_LIMIT_REQUESTS: '2', RATE_LIMIT_WINDOW_SECONDS: '3600' } });
      try {
        const tenant = await createTenant(limited.store, 5);
        const at = `${limited.url}/api/v1`;
        const body = { model: 'sandbox/chat-1', messages: [{ role: 'user', content: 'x' }], max_tokens: 3 };
        expect((await call(`${at}/chat/completions`, { key: tenant.inferenceKey, body })).status).to.equal(200);
        expect((await streamCall(`${at}/chat/completions`, tenant.inferenceKey, { ...body, stream: true })).status).to.equal(200);
        for (const [path, extra] of [
          ['/chat/completions', { stream: true }],
          ['/messages', {}],
          ['/responses', {}],
          ['/embeddings', {}],
        ] as const) {
          const r = await call(`${at}${path}`, { key: tenant.inferenceKey, body: { ...body, ...extra } });
          expect(r.status, path).to.equal(429);
          expect(r.body.error.code).to.equal(429);
          expect(Number(r.headers.get('retry-after'))).to.be.greaterThan(0);
        }
      } finally {
        await limited.stop();
      }
    });
  });

  describe('refusals', () => {
    it('validation errors name the field, for every route', async () => {
      const cases: [string, unknown, RegExp][] = [
        ['/chat/completions', { model: 'test/good' }, /messages/],
        ['/chat/completions', { model: 'test/good', messages: [] }, /messages/],
        ['/chat/completions', { model: 'test/good', messages: [{ role: 'robot', content: 'x' }] }, /role/],
        ['/chat/completions', { messages: [{ role: 'user', content: 'x' }] }, /model/],
        ['/chat/completions', { model: 'test/good', messages: [{ role: 'user', content: 'x' }], temperature: 9 }, /temperature/],
        ['/messages', { model: 'test/good', messages: [{ role: 'user', content: 'x' }] }, /max_tokens/],
        ['/messages', { model: 'test/good', max_tokens: 0, messages: [{ role: 'user', content: 'x' }] }, /max_tokens/],
        ['/messages', { model: 'test/good', max_tokens: 5, messages: [{ role: 'system', content: 'x' }] }, /role/],
        ['/responses', { model: 'test/good' }, /input/],
        ['/responses', { model: 'test/good', input: '' }, /input/],
        ['/embeddings', { model: 'sandbox/embed-1' }, /input/],
        ['/embeddings', { model: 'sandbox/embed-1', input: 'x', encoding_format: 'hex' }, /encoding_format/],
        ['/embeddings', { model: 'sandbox/embed-1', input: 'x', stream: true }, /stream/],
      ];
      for (const [path, body, field] of cases) {
        const r = await post(path, body);
        expect(r.status, `${path} ${JSON.stringify(body)}: ${JSON.stringify(r.body)}`).to.equal(400);
        expect(r.body.error.code).to.equal(400);
        expect(r.body.error.message).to.match(field);
      }
      const unknown = await post('/chat/completions', { model: 'nope/never', messages: [{ role: 'user', content: 'x' }] });
      expect(unknown.status).to.equal(404);
      expect(unknown.body.error.message).to.match(/nope\/never/);
      const wrongKind = await post('/embeddings', { model: 'test/good', input: 'x' });
      expect(wrongKind.status).to.equal(404);
    });

    it('previous_response_id and conversation: a 400 saying the gateway keeps none, streamed or not, in a preset or a batch line; the provider is not called (before: answered without the history); null names none', async () => {
      const spec = `run=${run}`;
      const before = await sandboxCount('_calls', spec, RESPONSES);
      const why = 'the gateway keeps no conversations (it is stateless): send the whole conversation in input';
      for (const [field, value] of [
        ['previous_response_id', 'resp_abc'],
        ['conversation', { id: 'conv_1' }],
        ['previous_response_id', ''],
      ] as const)
        for (const stream of [false, true]) {
          const r = await post('/responses', { model: 'test/good', input: 'and then?', [field]: value, stream });
          expect(r.status, JSON.stringify(r.body)).to.equal(400);
          expect(r.body.error.message).to.equal(`${field}: is not accepted: ${why}`);
        }
      // null names none: answered.
      const none = await post('/responses', {
        model: 'test/good',
        input: 'hi',
        previous_response_id: null,
        conversation: null,
        provider: { only: ['good'] }, // the endpoint counted below
      });
      expect(none.status, JSON.stringify(none.body)).to.equal(200);
      const preset = await call(url(`/presets/${uniqueName('p')}/responses`), {
        key: t.managementKey,
        body: { model: 'test/good', previous_response_id: 'resp_abc' },
      });
      expect(preset.status, JSON.stringify(preset.body)).to.equal(400);
      expect(preset.body.error.message).to.include(`previous_response_id: is not accepted: ${why}`);
      const batch = await call(url('/batches'), {
        key: t.inferenceKey,
        body: {
          endpoint: '/v1/responses',
          model: 'test/good',
          requests: [{ custom_id: 'a', body: { input: 'and then?', previous_response_id: 'resp_abc' } }],
        },
      });
      expect(batch.status, JSON.stringify(batch.body)).to.equal(202);
      const failed = await waitForStatus(gw.url, t.inferenceKey, batch.body.id, ['completed', 'failed']);
      expect(failed.status).to.equal('failed');
      expect(failed.error.message).to.include(`a (previous_response_id: is not accepted: ${why})`);
      expect(await sandboxCount('_calls', spec, RESPONSES)).to.equal(before + 1);
    });

    it('background responses: a 400, streamed or not, in a batch line too; the provider is not called (before: answered queued, billed $0, while the provider runs and bills it)', async () => {
      const spec = `run=${run}`;
      const before = await sandboxCount('_calls', spec, RESPONSES);
      for (const stream of [false, true]) {
        // On the OpenAI-format endpoint, which would take it (a translation to Messages drops it).
        const r = await post('/responses', {
          model: 'test/good',
          input: 'write a novel',
          background: true,
          stream,
          provider: { only: ['good'] },
        });
        expect(r.status, JSON.stringify(r.body)).to.equal(400);
        expect(r.body.error.message).to.equal(
          'background: must be false (the gateway answers a response once it is done and keeps none to fetch later)',
        );
      }
      const batch = await call(url('/batches'), {
        key: t.inferenceKey,
        body: { endpoint: '/v1/responses', model: 'test/good', requests: [{ custom_id: 'a', body: { input: 'x', background: true } }] },
      });
      const failed = await waitForStatus(gw.url, t.inferenceKey, batch.body.id, ['completed', 'failed']);
      expect(failed.error.message).to.include('a (background: must be false');
      expect(await sandboxCount('_calls', spec, RESPONSES)).to.equal(before);
      const foreground = await post('/responses', { model: 'test/good', input: 'hi', background: false });
      expect(foreground.status).to.equal(200);
      expect(foreground.body.status).to.equal('completed');
    });

    it('a provider tier (priority processing, flex processing, fast mode) the catalog lists no endpoint for, and server tools it gives no price for, are a 400, from a preset or a batch line too; the provider is not called (before: billed at the standard price, the tools not at all)', async () => {
      const spec = `run=${run}`;
      const counted = async () =>
        (await sandboxCount('_calls', spec, CHAT)) +
        (await sandboxCount('_calls', spec, RESPONSES)) +
        (await sandboxCount('_calls', spec, MESSAGES));
      const before = await counted();
      const refused = (setting: string) =>
        `${setting} is a provider tier billed away from the standard prices, and no endpoint of test/good is listed for it at its own`;
      const tier = refused('service_tier: "priority"');
      const fast = refused('speed: "fast"');
      const user = [{ role: 'user', content: 'hi' }];
      for (const stream of [false, true])
        for (const [path, body, message] of [
          ['/chat/completions', { model: 'test/good', messages: user, service_tier: 'priority', stream }, tier],
          ['/responses', { model: 'test/good', input: 'hi', service_tier: 'priority', stream }, tier],
          ['/messages', { model: 'test/good', messages: user, max_tokens: 5, speed: 'fast', stream }, fast],
          ['/chat/completions', { model: 'test/good', messages: user, service_tier: 'flex', stream }, refused('service_tier: "flex"')],
        ] as const) {
          const r = await post(path, body);
          expect(r.status, `${path} ${JSON.stringify(r.body)}`).to.equal(400);
          expect(r.body.error.message).to.equal(message);
        }
      const unpriced = (i: number, type: string) =>
        `tools[${i}].type: "${type}" runs on the provider at a price the catalog does not give, which this gateway does not bill`;
      for (const [path, body, message] of [
        [
          '/responses',
          { model: 'test/good', input: 'hi', tools: [{ type: 'code_interpreter', container: { type: 'auto' } }] },
          unpriced(0, 'code_interpreter'),
        ],
        [
          '/responses',
          { model: 'test/good', input: 'hi', tools: [{ type: 'web_search' }, { type: 'file_search', vector_store_ids: ['vs_1'] }] },
          unpriced(1, 'file_search'),
        ],
        ['/responses', { model: 'test/good', input: 'hi', tools: [{ type: 'image_generation' }] }, unpriced(0, 'image_generation')],
        [
          '/messages',
          { model: 'test/good', messages: user, max_tokens: 5, tools: [{ type: 'code_execution_20250825', name: 'code_execution' }] },
          unpriced(0, 'code_execution_20250825'),
        ],
      ] as const) {
        const r = await post(path, body);
        expect(r.status, `${path} ${JSON.stringify(r.body)}`).to.equal(400);
        expect(r.body.error.message).to.equal(message);
      }
      // A preset may store fast mode (the preset interface allows it); a call naming it is refused.
      const slug = uniqueName('fast');
      const preset = await call(url(`/presets/${slug}/messages`), { key: t.managementKey, body: { model: 'test/good', speed: 'fast' } });
      expect(preset.status, JSON.stringify(preset.body)).to.equal(200);
      const viaPreset = await post('/messages', { model: `@preset/${slug}`, messages: user, max_tokens: 5 });
      expect(viaPreset.status).to.equal(400);
      expect(viaPreset.body.error.message).to.equal(fast);
      const batch = await call(url('/batches'), {
        key: t.inferenceKey,
        body: {
          endpoint: '/v1/chat/completions',
          model: 'test/good',
          requests: [
            { custom_id: 'p', body: { messages: user, service_tier: 'priority' } },
            { custom_id: 'i', body: { messages: user, tools: [{ type: 'image_generation' }] } },
          ],
        },
      });
      const done = await waitForStatus(gw.url, t.inferenceKey, batch.body.id, ['completed', 'failed']);
      expect(done.results[0].error).to.deep.include({ code: 400, message: tier });
      expect(done.results[1].error).to.deep.include({ code: 400, message: unpriced(0, 'image_generation') });
      expect(await counted()).to.equal(before);
      // The standard settings are served.
      expect((await post('/chat/completions', { model: 'test/good', messages: user, service_tier: 'auto' })).status).to.equal(200);
      expect((await post('/messages', { model: 'test/good', messages: user, max_tokens: 5, speed: 'standard' })).status).to.equal(200);
    });

    it('a provider tier the catalog lists endpoints for goes to them only, billed at their prices; other calls never do; streamed, and in batch lines too', async () => {
      const user = [{ role: 'user', content: 'hi' }];
      /** The price multiple an answer was billed at: endpoint() prices completions at 4 times prompts. */
      const multiple = (u: {
        cost: number;
        prompt_tokens?: number;
        completion_tokens?: number;
        input_tokens?: number;
        output_tokens?: number;
      }) => Math.round((10 * u.cost * 1e6) / ((u.prompt_tokens ?? u.input_tokens)! + 4 * (u.completion_tokens ?? u.output_tokens)!)) / 10;
      for (let i = 0; i < 4; i++) {
        const standard = await post('/chat/completions', { model: 'test/tiered', messages: user, max_tokens: 5 });
        expect(multiple(standard.body.usage), 'standard').to.equal(1);
      }
      const priority = await post('/chat/completions', { model: 'test/tiered', messages: user, max_tokens: 5, service_tier: 'priority' });
      expect(priority.status, JSON.stringify(priority.body)).to.equal(200);
      expect(priority.body.provider).to.equal('good');
      expect(multiple(priority.body.usage)).to.equal(2);
      const viaResponses = await post('/responses', { model: 'test/tiered', input: 'hi', max_output_tokens: 5, service_tier: 'priority' });
      expect(multiple(viaResponses.body.usage)).to.equal(2);
      const fast = await post('/messages', { model: 'test/tiered', messages: user, max_tokens: 5, speed: 'fast' });
      expect(fast.status, JSON.stringify(fast.body)).to.equal(200);
      expect(fast.body.provider).to.equal('good-claude');
      expect(multiple(fast.body.usage)).to.equal(6);
      // Flex processing, half the standard price: the provider is asked for it and says so.
      const flex = await post('/chat/completions', { model: 'test/tiered', messages: user, max_tokens: 5, service_tier: 'flex' });
      expect(flex.status, JSON.stringify(flex.body)).to.equal(200);
      expect([flex.body.service_tier, multiple(flex.body.usage)]).to.deep.equal(['flex', 0.5]);
      // Streamed: the usage chunk's cost, and the record billed.
      const streamed = await streamCall(url('/chat/completions'), t.inferenceKey, {
        model: 'test/tiered',
        messages: user,
        max_tokens: 5,
        service_tier: 'priority',
        stream: true,
        stream_options: { include_usage: true },
      });
      const withUsage = streamed.events.find((e) => e.json?.usage);
      expect(multiple(withUsage!.json.usage)).to.equal(2);
      // The endpoints' listing names their tiers.
      const listed = (await call(url('/models/test/tiered/endpoints'), { key: t.inferenceKey })).body.data.endpoints;
      expect(listed.map((e: { tag: string; service_tier: string | null }) => [e.tag, e.service_tier]).sort()).to.deep.equal([
        ['good', null],
        ['good-claude', null],
        ['good-claude/fast', 'fast'],
        ['good/flex', 'flex'],
        ['good/priority', 'priority'],
      ]);
      // A batch line asking for the tier is served and billed at it.
      const batch = await call(url('/batches'), {
        key: t.inferenceKey,
        body: {
          endpoint: '/v1/chat/completions',
          model: 'test/tiered',
          requests: [
            { custom_id: 'p', body: { messages: user, max_tokens: 5, service_tier: 'priority' } },
            { custom_id: 's', body: { messages: user, max_tokens: 5 } },
          ],
        },
      });
      const done = await waitForStatus(gw.url, t.inferenceKey, batch.body.id, ['completed', 'failed']);
      expect(done.request_counts).to.deep.equal({ total: 2, completed: 2, failed: 0 });
      await gw.usage.flushed();
      const records = await storedUsage(gw.store, { batch_id: batch.body.id });
      const billed = records.map((u) => multiple({ cost: u.cost, input_tokens: u.input_tokens, output_tokens: u.output_tokens }));
      expect(billed.sort()).to.deep.equal([1, 2]);
    });

    it("a call that asks for no tier opts in to one as OpenRouter's do: :nitro to priority endpoints, :floor to flex ones, a full tag in provider.only or order to its endpoint; the provider is asked for the tier, and it is billed at its prices; in batch lines too", async () => {
      const user = [{ role: 'user', content: 'hi' }];
      const multiple = (u: { cost: number; prompt_tokens: number; completion_tokens: number }) =>
        Math.round((10 * u.cost * 1e6) / (u.prompt_tokens + 4 * u.completion_tokens)) / 10;
      // Without an opt-in the priority endpoint never serves: the standard one fails, and so does the call.
      const none = await post('/chat/completions', { model: 'test/opt-in', messages: user, max_tokens: 5 });
      expect(none.status, JSON.stringify(none.body)).to.equal(502);
      for (const body of [
        { model: 'test/opt-in:nitro' },
        { model: 'test/opt-in', provider: { only: ['good/priority'] } },
        { model: 'test/opt-in', provider: { order: ['broken', 'good/priority'] } },
      ]) {
        const r = await post('/chat/completions', { ...body, messages: user, max_tokens: 5 });
        expect(r.status, JSON.stringify(r.body)).to.equal(200);
        expect([r.body.provider, r.body.service_tier, multiple(r.body.usage)], JSON.stringify(body)).to.deep.equal(['good', 'priority', 2]);
      }
      // A base slug names a provider's endpoints of no tier only.
      const base = await post('/chat/completions', { model: 'test/opt-in', messages: user, max_tokens: 5, provider: { only: ['good'] } });
      expect(base.status).to.equal(404);
      // :floor sorts by price with flex endpoints competing: the flex one, at half the price.
      const floor = await post('/chat/completions', { model: 'test/tiered:floor', messages: user, max_tokens: 5 });
      expect([floor.body.service_tier, multiple(floor.body.usage)]).to.deep.equal(['flex', 0.5]);
      // A batch line on :floor likewise.
      const line = await billedBatchLine(gw, t.inferenceKey, 'test/tiered:floor', { messages: user, max_tokens: 5 });
      expect(Math.round((10 * line.cost * 1e6) / (line.input_tokens + 4 * line.output_tokens)) / 10).to.equal(0.5);
    });

    it('401 without a key or with a wrong one, 403 for a management operation, 402 without credits, in the envelope, streamed or not', async () => {
      const body = { model: 'test/good', messages: [{ role: 'user', content: 'x' }], stream: true };
      const none = await call(url('/chat/completions'), { body });
      expect(none.status).to.equal(401);
      expect(none.body.error.code).to.equal(401);
      const bad = await call(url('/messages'), { body, headers: { 'x-api-key': 'sk-nope' } });
      expect(bad.status).to.equal(401);
      // Inference routes take any live key; creating the preset they use takes a management key.
      const forbidden = await call(url('/presets/mine/chat/completions'), { key: t.inferenceKey, body: { model: 'test/good' } });
      expect(forbidden.status).to.equal(403);
      expect(forbidden.body.error).to.include({ code: 403 });
      expect(forbidden.body.error.message).to.match(/management/);
      const broke = await createTenant(gw.store, 0);
      const poor = await call(url('/chat/completions'), { key: broke.inferenceKey, body });
      expect(poor.status).to.equal(402);
      expect(poor.body.error.code).to.equal(402);
      expect(await gw.store.usage.countDocuments({ workspace_id: broke.workspaceId })).to.equal(0);
    });
  });
});
