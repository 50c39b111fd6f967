// Any chat model through any chat API: the official OpenAI client on /chat/completions and
// /responses against a model only an Anthropic-format provider serves, and the Anthropic client on
// /messages against one only an OpenAI-format provider serves; plain, streamed (the SDKs' own stream helpers), tool calls
// round trip, images, stop reasons, usage; what cannot be carried is a 400; batches too.
import { expect } from 'chai';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { endpointEntry, modelEntry, providerEntry } from '../domain/catalog/entries';
import {
  call,
  createTenant,
  startTestGateway,
  uniqueName,
  waitForStatus,
  writeTestCatalog,
  type Tenant,
  type TestGateway,
} from './helpers';

const run = uniqueName('tr');
const PIXEL = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==';
const weather = {
  name: 'get_weather',
  description: 'The weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] },
};

describe('format translation: any chat model through any chat API', function () {
  this.timeout(60_000);
  let gw: TestGateway;
  let t: Tenant;
  let openai: OpenAI;
  let anthropic: Anthropic;

  before(async () => {
    const catalog = writeTestCatalog('translation', (c) => {
      c.providers.push(
        providerEntry('tr-claude', `\${SANDBOX_URL}/~run=${run},max_words=20/anthropic`, { adapter: 'anthropic' }),
        providerEntry('tr-gpt', `\${SANDBOX_URL}/~run=${run},max_words=20/openai/v1`),
      );
      c.models.push(
        modelEntry('tr/claude-only', [endpointEntry('tr-claude', 1, { supported_parameters: ['temperature', 'tools', 'max_tokens'] })]),
        modelEntry('tr/gpt-only', [endpointEntry('tr-gpt', 1, { supported_parameters: ['temperature', 'tools', 'max_tokens'] })]),
      );
    });
    gw = await startTestGateway({ env: { CATALOG_PATH: catalog } });
    t = await createTenant(gw.store, 20);
    openai = new OpenAI({ apiKey: t.inferenceKey, baseURL: `${gw.url}/api/v1`, maxRetries: 0 });
    anthropic = new Anthropic({ apiKey: t.inferenceKey, baseURL: `${gw.url}/api`, maxRetries: 0 });
  });
  after(async () => {
    await gw.stop();
  });

  describe('the OpenAI client, to a model only an Anthropic-format provider serves', () => {
    const model = 'tr/claude-only';

    it('plain and streamed: the stream helper accumulates the same message, usage included', async () => {
      const ask = {
        model,
        messages: [
          { role: 'system' as const, content: 'Be brief.' },
          { role: 'user' as const, content: 'Hello there' },
        ],
      };
      const r = await openai.chat.completions.create({ ...ask, max_tokens: 50 });
      expect(r.model).to.equal('tr/claude-only-20260101');
      expect((r as any).provider).to.equal('tr-claude');
      expect(r.choices[0].finish_reason).to.equal('stop');
      expect(r.choices[0].message.content).to.be.a('string').and.not.empty;
      expect(r.usage!.prompt_tokens).to.be.greaterThan(0);
      expect(r.usage!.completion_tokens).to.equal(r.choices[0].message.content!.split(' ').length);

      const stream = openai.chat.completions.stream({ ...ask, max_tokens: 50, stream_options: { include_usage: true } });
      const final = await stream.finalChatCompletion();
      expect(final.choices[0].message.content).to.equal(r.choices[0].message.content);
      expect(final.choices[0].finish_reason).to.equal('stop');
      expect(final.usage).to.include({ prompt_tokens: r.usage!.prompt_tokens, completion_tokens: r.usage!.completion_tokens });
    });

    it('tool calls round trip, streamed and not', async () => {
      const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: 'user', content: 'Weather in Paris?' }];
      const tools = [{ type: 'function' as const, function: weather }];
      const r = await openai.chat.completions.create({ model, messages, tools, max_tokens: 50 });
      expect(r.choices[0].finish_reason).to.equal('tool_calls');
      const [tc] = r.choices[0].message.tool_calls!;
      expect(tc.type).to.equal('function');
      expect((tc as any).function.name).to.equal('get_weather');
      const args = JSON.parse((tc as any).function.arguments);
      expect(args).to.have.keys('city', 'days');
      expect(args.days).to.be.a('number');

      const streamed = await openai.chat.completions.stream({ model, messages, tools, max_tokens: 50 }).finalChatCompletion();
      expect(streamed.choices[0].finish_reason).to.equal('tool_calls');
      expect((streamed.choices[0].message.tool_calls![0] as any).function).to.deep.include({
        name: 'get_weather',
        arguments: (tc as any).function.arguments,
      });
      expect(streamed.choices[0].message.tool_calls![0].id).to.equal(tc.id);

      const answered = await openai.chat.completions.create({
        model,
        tools,
        max_tokens: 50,
        messages: [...messages, r.choices[0].message, { role: 'tool', tool_call_id: tc.id, content: 'Sunny and 21 degrees' }],
      });
      expect(answered.choices[0].finish_reason).to.equal('stop');
      expect(answered.choices[0].message.content).to.match(/^The tool said: Sunny and 21 degrees\./);
    });

    it('images by URL and base64, and every stop reason', async () => {
      const image = await openai.chat.completions.create({
        model,
        max_tokens: 50,
        messages: [
          {
            role: 'user',
            content: [
              { type: 'text', text: 'What is in these?' },
              { type: 'image_url', image_url: { url: `data:image/png;base64,${PIXEL}` } },
              { type: 'image_url', image_url: { url: 'https://example.com/cat.png' } },
            ],
          },
        ],
      });
      expect(image.choices[0].message.content).to.match(/^I see 2 images\./);
      const capped = await openai.chat.completions.create({ model, max_tokens: 3, messages: [{ role: 'user', content: 'Long answer' }] });
      expect(capped.choices[0].finish_reason).to.equal('length');
      expect(capped.choices[0].message.content!.split(' ')).to.have.length(3);
      const refused = await openai.chat.completions.create({
        model,
        max_tokens: 20,
        messages: [{ role: 'user', content: '[refuse] this' }],
      });
      expect(refused.choices[0].finish_reason).to.equal('content_filter');
      const full = await openai.chat.completions.create({ model, max_tokens: 50, messages: [{ role: 'user', content: 'Stop early' }] });
      const words = full.choices[0].message.content!.split(' ');
      const word = words.find((w, i) => i > 0 && words.indexOf(w) === i)!; // a word that first appears after the first
      const stopped = await openai.chat.completions.create({
        model,
        max_tokens: 50,
        stop: [word],
        messages: [{ role: 'user', content: 'Stop early' }],
      });
      expect(stopped.choices[0].finish_reason).to.equal('stop');
      expect(stopped.choices[0].message.content!.split(' ')).to.not.include(word);
    });

    it('structured output: a JSON schema answer, streamed and not', async () => {
      const response_format = {
        type: 'json_schema' as const,
        json_schema: {
          name: 'city',
          schema: { type: 'object', properties: { name: { type: 'string' }, population: { type: 'integer' } } },
        },
      };
      const ask = { model, max_tokens: 50, response_format, messages: [{ role: 'user' as const, content: 'A city, as JSON' }] };
      const r = await openai.chat.completions.create(ask);
      expect(r.choices[0].finish_reason).to.equal('stop');
      expect(r.choices[0].message.tool_calls).to.equal(undefined);
      const parsed = JSON.parse(r.choices[0].message.content!);
      expect(parsed).to.have.keys('name', 'population');
      expect(parsed.population).to.be.a('number');
      const streamed = await openai.chat.completions.stream(ask).finalChatCompletion();
      expect(streamed.choices[0].message.content).to.equal(r.choices[0].message.content);
      expect(streamed.choices[0].finish_reason).to.equal('stop');
    });

    it('names the parameters the provider cannot take, and refuses content it cannot carry with a 400 naming the field', async () => {
      const r = await call(`${gw.url}/api/v1/chat/completions`, {
        key: t.inferenceKey,
        body: { model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 5, seed: 7, frequency_penalty: 0.5 },
      });
      expect(r.status, JSON.stringify(r.body)).to.equal(200);
      expect(r.headers.get('x-gateway-dropped-params')).to.equal('frequency_penalty,seed');
      // A parameter the call requires is never dropped: the endpoint refuses it (and no other can take it here).
      const required = await call(`${gw.url}/api/v1/chat/completions`, {
        key: t.inferenceKey,
        body: {
          model,
          messages: [{ role: 'user', content: 'hi' }],
          max_tokens: 5,
          temperature: 1.5,
          provider: { require_parameters: true },
        },
      });
      expect(required.status, JSON.stringify(required.body)).to.equal(400);
      expect(required.body.error.message).to.match(
        /^provider\.require_parameters: temperature cannot be sent to tr-claude \(anthropic format\)/,
      );
      const audio = await call(`${gw.url}/api/v1/chat/completions`, {
        key: t.inferenceKey,
        body: { model, messages: [{ role: 'user', content: [{ type: 'input_audio', input_audio: { data: 'AAAA', format: 'wav' } }] }] },
      });
      // Audio is refused before routing here: no endpoint of the model has an audio price (spend.test.ts).
      expect(audio.status, JSON.stringify(audio.body)).to.equal(400);
      expect(audio.body.error.message).to.match(/^messages\[0\]\.content\[0\]: audio sent .* has an audio price in the catalog$/);
      const video = await call(`${gw.url}/api/v1/chat/completions`, {
        key: t.inferenceKey,
        body: { model, messages: [{ role: 'user', content: [{ type: 'video_url', video_url: { url: 'https://example.com/v.mp4' } }] }] },
      });
      expect(video.status, JSON.stringify(video.body)).to.equal(400);
      expect(video.body.error.message).to.match(/^messages\[0\]\.content\[0\]\.type: .*video_url.* anthropic format/);
    });
  });

  describe('the OpenAI client on /responses, to a model only an Anthropic-format provider serves', () => {
    const model = 'tr/claude-only';
    const tools = [{ type: 'function' as const, ...weather, strict: false }];

    it('plain and streamed: the stream helper accumulates the same response, usage included', async () => {
      const ask = { model, instructions: 'Be brief.', input: 'Hello there', max_output_tokens: 50 };
      const r = await openai.responses.create(ask);
      expect(r.status).to.equal('completed');
      expect(r.output_text).to.be.a('string').and.not.empty;
      expect(r.usage!.input_tokens).to.be.greaterThan(0);
      const final = await openai.responses.stream(ask).finalResponse();
      expect(final.output_text).to.equal(r.output_text);
      expect(final.status).to.equal('completed');
      expect(final.usage).to.include({ input_tokens: r.usage!.input_tokens, output_tokens: r.usage!.output_tokens });
    });

    it('function calls round trip, streamed and not; a capped answer is incomplete', async () => {
      const input: OpenAI.Responses.ResponseInput = [{ role: 'user', content: 'Weather in Paris?' }];
      const r = await openai.responses.create({ model, input, tools, max_output_tokens: 50 });
      const call = r.output.find((o) => o.type === 'function_call') as OpenAI.Responses.ResponseFunctionToolCall;
      expect(call.name).to.equal('get_weather');
      expect(JSON.parse(call.arguments)).to.have.keys('city', 'days');
      const streamed = await openai.responses.stream({ model, input, tools, max_output_tokens: 50 }).finalResponse();
      const streamedCall = streamed.output.find((o) => o.type === 'function_call') as OpenAI.Responses.ResponseFunctionToolCall;
      expect(streamedCall).to.include({ name: call.name, arguments: call.arguments, call_id: call.call_id });

      const answered = await openai.responses.create({
        model,
        tools,
        max_output_tokens: 50,
        input: [...input, call, { type: 'function_call_output', call_id: call.call_id, output: 'Sunny and 21 degrees' }],
      });
      expect(answered.output_text).to.match(/^The tool said: Sunny and 21 degrees\./);
      const capped = await openai.responses.create({ model, input: 'Long answer', max_output_tokens: 3 });
      expect(capped.status).to.equal('incomplete');
      expect(capped.incomplete_details).to.deep.equal({ reason: 'max_output_tokens' });
    });
  });

  describe('the Anthropic client, to a model only an OpenAI-format provider serves', () => {
    const model = 'tr/gpt-only';

    it('plain and streamed: the stream helper accumulates the same message, usage included', async () => {
      const ask = { model, max_tokens: 50, system: 'Be brief.', messages: [{ role: 'user' as const, content: 'Hello there' }] };
      const r = await anthropic.messages.create(ask);
      expect(r.model).to.equal('tr/gpt-only-20260101');
      expect(r.stop_reason).to.equal('end_turn');
      expect(r.content[0].type).to.equal('text');
      expect(r.usage.input_tokens).to.be.greaterThan(0);
      const final = await anthropic.messages.stream(ask).finalMessage();
      expect(final.content).to.deep.equal(r.content);
      expect(final.stop_reason).to.equal('end_turn');
      expect(final.usage).to.include({ input_tokens: r.usage.input_tokens, output_tokens: r.usage.output_tokens });
    });

    it('tool use round trips, streamed and not', async () => {
      const tools = [
        { name: weather.name, description: weather.description, input_schema: weather.parameters as Anthropic.Tool.InputSchema },
      ];
      const messages: Anthropic.MessageParam[] = [{ role: 'user', content: 'Weather in Paris?' }];
      const r = await anthropic.messages.create({ model, max_tokens: 50, tools, messages });
      expect(r.stop_reason).to.equal('tool_use');
      const use = r.content.find((b) => b.type === 'tool_use') as Anthropic.ToolUseBlock;
      expect(use.name).to.equal('get_weather');
      expect(use.input).to.have.keys('city', 'days');
      const streamed = await anthropic.messages.stream({ model, max_tokens: 50, tools, messages }).finalMessage();
      expect(streamed.stop_reason).to.equal('tool_use');
      expect(streamed.content.find((b) => b.type === 'tool_use')).to.deep.equal(use);

      const answered = await anthropic.messages.create({
        model,
        max_tokens: 50,
        tools,
        messages: [
          ...messages,
          { role: 'assistant', content: r.content },
          { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'Sunny and 21 degrees' }] },
        ],
      });
      expect(answered.stop_reason).to.equal('end_turn');
      expect((answered.content[0] as Anthropic.TextBlock).text).to.match(/^The tool said: Sunny and 21 degrees\./);
    });

    it('images, and every stop reason', async () => {
      const image = await anthropic.messages.create({
        model,
        max_tokens: 50,
        messages: [
          {
            role: 'user',
            content: [
              { type: 'image', source: { type: 'base64', media_type: 'image/png', data: PIXEL } },
              { type: 'text', text: 'What is this?' },
            ],
          },
        ],
      });
      expect((image.content[0] as Anthropic.TextBlock).text).to.match(/^I see 1 image\./);
      const capped = await anthropic.messages.create({ model, max_tokens: 3, messages: [{ role: 'user', content: 'Long answer' }] });
      expect(capped.stop_reason).to.equal('max_tokens');
      const refused = await anthropic.messages.create({ model, max_tokens: 20, messages: [{ role: 'user', content: '[refuse] this' }] });
      expect(refused.stop_reason).to.equal('refusal');
    });
  });

  it('batches: each chat endpoint works for a model served only by the other format', async () => {
    const cases = [
      { endpoint: '/v1/chat/completions', model: 'tr/claude-only', body: { messages: [{ role: 'user', content: 'hi' }], max_tokens: 5 } },
      { endpoint: '/v1/messages', model: 'tr/gpt-only', body: { messages: [{ role: 'user', content: 'hi' }], max_tokens: 5 } },
      { endpoint: '/v1/responses', model: 'tr/claude-only', body: { input: 'hi', max_output_tokens: 5 } },
    ];
    for (const c of cases) {
      const created = await call(`${gw.url}/api/v1/batches`, {
        key: t.inferenceKey,
        body: { endpoint: c.endpoint, model: c.model, requests: [0, 1].map((i) => ({ custom_id: `r${i}`, body: c.body })) },
      });
      expect(created.status, JSON.stringify(created.body)).to.equal(202);
      const done = await waitForStatus(gw.url, t.inferenceKey, created.body.id, ['completed', 'failed']);
      expect(done.request_counts, c.endpoint).to.include({ completed: 2, failed: 0 });
      const body = done.results[0].response.body;
      if (c.endpoint === '/v1/messages') expect(body).to.include({ type: 'message', stop_reason: 'max_tokens' });
      else if (c.endpoint === '/v1/responses') expect(body).to.include({ object: 'response', status: 'incomplete' });
      else expect(body.choices[0]).to.include({ finish_reason: 'length' });
    }
  });
});
