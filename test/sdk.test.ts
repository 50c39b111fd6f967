// The official OpenAI and Anthropic clients against the gateway, changing only their base URL and
// key: what a user switching to the gateway does.
import { expect } from 'chai';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { createTenant, startTestGateway, uniqueName, writeTestCatalog, type Tenant, type TestGateway } from './helpers';

const run = uniqueName('sdk');

describe('official SDKs against the gateway', function () {
  this.timeout(60_000);
  let gw: TestGateway;
  let t: Tenant;
  let openai: OpenAI;
  let anthropic: Anthropic;

  before(async () => {
    const catalog = writeTestCatalog('sdk', (c) => {
      for (const adapter of ['openai', 'anthropic'] as const) {
        c.providers.push({
          slug: `dying-${adapter}`,
          name: 'dies after three words',
          adapter,
          base_url: `\${SANDBOX_URL}/~run=${run},fail_after=3,max_words=30/${adapter}${adapter === 'openai' ? '/v1' : ''}`,
          collects_data: false,
          zdr: false,
          max_concurrency: 10,
          timeout_ms: 5000,
        });
      }
      c.models.push({
        id: 'test/dying',
        name: 'dying',
        kind: 'chat',
        family: 'test/dying',
        version: '1',
        released: '20260301',
        context_length: 8192,
        distillable: true,
        endpoints: ['openai', 'anthropic'].map((a) => ({
          provider: `dying-${a}`,
          upstream_model: 'm',
          pricing: { prompt: 1, completion: 1 },
          quantization: 'bf16',
          supported_parameters: [],
        })),
      });
    });
    gw = await startTestGateway({ env: { CATALOG_PATH: catalog } });
    t = await createTenant(gw.store, 20);
    openai = new OpenAI({ apiKey: t.inferenceKey, baseURL: `${gw.url}/api/v1`, maxRetries: 0 });
    anthropic = new Anthropic({ apiKey: t.inferenceKey, baseURL: `${gw.url}/api`, maxRetries: 0 });
  });
  after(async () => {
    await gw.stop();
  });

  describe('openai', () => {
    it('chat completions, not streamed', async () => {
      const r = await openai.chat.completions.create({
        model: 'sandbox/chat-1',
        messages: [{ role: 'user', content: 'Hello' }],
        max_tokens: 6,
      });
      expect(r.id).to.match(/^gen-/);
      expect(r.model).to.equal('sandbox/chat-1-20261015');
      expect(r.choices[0].message.content).to.be.a('string').and.not.empty;
      expect(r.usage!.completion_tokens).to.be.greaterThan(0);
      expect((r as any).provider).to.be.a('string');
    });

    it('chat completions, streamed, with usage in the last chunk', async () => {
      const stream = await openai.chat.completions.create({
        model: 'sandbox/chat-1',
        messages: [{ role: 'user', content: 'Stream to me' }],
        max_tokens: 8,
        stream: true,
        stream_options: { include_usage: true },
      });
      let text = '';
      let usage: OpenAI.CompletionUsage | null | undefined = null;
      for await (const chunk of stream) {
        text += chunk.choices[0]?.delta?.content ?? '';
        if (chunk.usage) usage = chunk.usage;
      }
      expect(text).to.not.equal('');
      expect(usage!.completion_tokens).to.be.greaterThan(0);
      expect((usage as any).cost).to.be.greaterThan(0);
    });

    it('a stream the provider breaks off raises an error in the client', async () => {
      const stream = await openai.chat.completions.create({
        model: 'test/dying',
        messages: [{ role: 'user', content: 'x' }],
        max_tokens: 30,
        stream: true,
      });
      let text = '';
      let caught: unknown = null;
      try {
        for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
      } catch (err) {
        caught = err;
      }
      expect(caught).to.be.instanceOf(OpenAI.APIError);
      expect((caught as Error).message).to.match(/dying-(openai|anthropic)/); // either format's endpoint may serve it
      expect(text.split(' ').filter(Boolean)).to.have.length(3);
    });

    it('embeddings, in the SDK default base64 encoding and as floats', async () => {
      const r = await openai.embeddings.create({ model: 'sandbox/embed-1', input: ['alpha', 'beta'], dimensions: 8 });
      expect(r.data).to.have.length(2);
      expect(r.data[0].embedding).to.have.length(8);
      const norm = Math.hypot(...r.data[0].embedding);
      expect(norm).to.be.closeTo(1, 1e-5);
      const floats = await openai.embeddings.create({ model: 'sandbox/embed-1', input: 'alpha', dimensions: 8, encoding_format: 'float' });
      floats.data[0].embedding.forEach((x, i) => expect(x).to.be.closeTo(r.data[0].embedding[i], 1e-6));
    });

    it('responses, streamed and not', async () => {
      const r = await openai.responses.create({ model: 'sandbox/chat-1', input: 'Write', max_output_tokens: 5 });
      expect(r.output_text).to.be.a('string').and.not.empty;
      expect(r.model).to.equal('sandbox/chat-1-20261015');
      const stream = await openai.responses.create({ model: 'sandbox/chat-1', input: 'Write', max_output_tokens: 5, stream: true });
      let text = '';
      let completed: OpenAI.Responses.Response | null = null;
      for await (const event of stream) {
        if (event.type === 'response.output_text.delta') text += event.delta;
        // Capped at 5 tokens: complete natively; incomplete (max_output_tokens) when an Anthropic-format endpoint served it.
        if (event.type === 'response.completed' || event.type === 'response.incomplete') completed = event.response;
      }
      expect(text).to.not.equal('');
      expect((completed!.output[0] as any).content[0].text).to.equal(text);
      expect(completed!.usage!.output_tokens).to.equal(text.split(' ').length);
    });

    it('errors arrive as the SDK error classes with the status', async () => {
      const broke = await createTenant(gw.store, 0);
      const poor = new OpenAI({ apiKey: broke.inferenceKey, baseURL: `${gw.url}/api/v1`, maxRetries: 0 });
      const err = await poor.chat.completions
        .create({ model: 'sandbox/chat-1', messages: [{ role: 'user', content: 'x' }] })
        .catch((e) => e);
      expect(err).to.be.instanceOf(OpenAI.APIError);
      expect(err.status).to.equal(402);
      const bad = new OpenAI({ apiKey: 'sk-wrong', baseURL: `${gw.url}/api/v1`, maxRetries: 0 });
      expect(await bad.embeddings.create({ model: 'sandbox/embed-1', input: 'x' }).catch((e) => e)).to.be.instanceOf(
        OpenAI.AuthenticationError,
      );
    });
  });

  describe('anthropic', () => {
    it('messages, not streamed', async () => {
      const m = await anthropic.messages.create({ model: 'sandbox/chat-1', max_tokens: 6, messages: [{ role: 'user', content: 'Hi' }] });
      expect(m.type).to.equal('message');
      expect(m.model).to.equal('sandbox/chat-1-20261015');
      expect(m.content[0].type).to.equal('text');
      expect(m.usage.output_tokens).to.be.greaterThan(0);
    });

    it('messages, streamed (the helper and raw events)', async () => {
      const stream = anthropic.messages.stream({ model: 'sandbox/chat-1', max_tokens: 6, messages: [{ role: 'user', content: 'Hi' }] });
      let text = '';
      stream.on('text', (delta) => (text += delta));
      const final = await stream.finalMessage();
      expect(final.content[0].type === 'text' && final.content[0].text).to.equal(text);
      expect(final.usage.output_tokens).to.be.greaterThan(0);
      const raw = await anthropic.messages.create({
        model: 'sandbox/chat-1',
        max_tokens: 6,
        messages: [{ role: 'user', content: 'Hi' }],
        stream: true,
      });
      const types: string[] = [];
      for await (const event of raw) types.push(event.type);
      expect(types[0]).to.equal('message_start');
      expect(types.at(-1)).to.equal('message_stop');
    });

    it('a stream the provider breaks off raises an error in the client', async () => {
      const stream = await anthropic.messages.create({
        model: 'test/dying',
        max_tokens: 30,
        messages: [{ role: 'user', content: 'x' }],
        stream: true,
      });
      const err = await (async () => {
        for await (const _event of stream);
      })().catch((e) => e);
      expect(err).to.be.instanceOf(Anthropic.APIError);
    });
  });
});
