// The provider wire formats (infrastructure/providers/formats/): each says where its operations live, how it is
// authenticated, where its token counts are and what its errors mean; the catalog accepts exactly
// the formats registered there.
import { expect } from 'chai';
import { FORMAT_NAMES, operationsOf, PROVIDER_FORMATS } from '../../infrastructure/providers/formats';
import { ProviderEntry } from '../../domain/catalog/schema';
import { StreamTally } from '../../domain/completions/formats';

const { openai, anthropic, systemone } = PROVIDER_FORMATS;
const event = (data: unknown, type?: string) => ({ id: undefined, event: type, data: JSON.stringify(data) });

describe('provider formats', () => {
  it('the catalog names exactly the registered formats, each serving its operations', () => {
    expect((ProviderEntry.properties.adapter as unknown as { enum: string[] }).enum).to.deep.equal(FORMAT_NAMES);
    expect(operationsOf('openai')).to.have.members(['chat', 'responses', 'embeddings']);
    expect(operationsOf('anthropic')).to.deep.equal(['messages']);
    expect(operationsOf('systemone')).to.deep.equal(['systemone']);
    expect(anthropic.paths.messages).to.equal('/v1/messages');
  });

  it('authenticates in each format, and sends no credential for a keyless provider', () => {
    expect(openai.headers('k')).to.deep.equal({ authorization: 'Bearer k' });
    expect(openai.headers(undefined)).to.deep.equal({});
    expect(anthropic.headers('k')).to.deep.equal({ 'anthropic-version': '2023-06-01', 'x-api-key': 'k' });
    expect(anthropic.headers(undefined)).to.deep.equal({ 'anthropic-version': '2023-06-01' });
    expect(systemone.headers('k')).to.deep.equal({ authorization: 'Bearer k' });
  });

  it('asks an OpenAI chat stream for its usage, keeping the stream options the client gave', () => {
    expect(openai.streamBody('chat', { stream_options: { x: 1 } })).to.deep.equal({
      stream: true,
      stream_options: { x: 1, include_usage: true },
    });
    expect(openai.streamBody('responses', {})).to.deep.equal({ stream: true });
    expect(anthropic.streamBody('messages', { a: 1 })).to.deep.equal({ a: 1, stream: true });
  });

  it('reads token counts where each format and operation keeps them, ignoring nonsense', () => {
    expect(openai.usageOf('chat', { usage: { prompt_tokens: 3, completion_tokens: 4 } })).to.deep.equal({
      input_tokens: 3,
      output_tokens: 4,
    });
    expect(openai.usageOf('embeddings', { usage: { total_tokens: 5 } })).to.deep.equal({ input_tokens: 5, output_tokens: 0 });
    expect(openai.usageOf('responses', { usage: { input_tokens: 1, output_tokens: 2 } })).to.deep.equal({
      input_tokens: 1,
      output_tokens: 2,
    });
    expect(anthropic.usageOf('messages', { usage: { input_tokens: 7, output_tokens: -1 } })).to.deep.equal({
      input_tokens: 7,
      output_tokens: 0,
    });
    expect(systemone.usageOf('systemone', {})).to.deep.equal({ input_tokens: 0, output_tokens: 0 });
    // Audio heard and spoken by a chat call: within the prompt and completion, named apart.
    expect(
      openai.usageOf('chat', {
        usage: {
          prompt_tokens: 120,
          completion_tokens: 9,
          prompt_tokens_details: { audio_tokens: 100 },
          completion_tokens_details: { audio_tokens: 9 },
        },
      }),
    ).to.deep.equal({ input_tokens: 120, output_tokens: 9, audio_input_tokens: 100, audio_output_tokens: 9 });
  });

  it('bills a stream that asked for audio and was cut short before its usage for its output as audio', () => {
    const tally = new StreamTally();
    tally.produced = 7;
    expect(tally.usage(50)).to.deep.equal({ input_tokens: 50, output_tokens: 7 });
    tally.audioAsked = true;
    expect(tally.usage(50)).to.deep.equal({ input_tokens: 50, output_tokens: 7, audio_output_tokens: 7 });
    // Once the provider reports, its counts are billed.
    tally.reported({ input_tokens: 60, output_tokens: 8, audio_input_tokens: 40, audio_output_tokens: 6 });
    tally.output = 8;
    tally.finished = true;
    expect(tally.usage(50)).to.deep.equal({ input_tokens: 60, output_tokens: 8, audio_input_tokens: 40, audio_output_tokens: 6 });
  });

  it('classifies error answers: overloaded, rate limited, other, with the provider words', () => {
    const o = anthropic.failureOf(529, { type: 'error', error: { type: 'overloaded_error', message: 'busy' } }, 'p', null);
    expect([o.kind, o.message, o.status]).to.deep.equal(['overloaded', 'busy', 529]);
    const r = openai.failureOf(429, { error: { message: 'slow down' } }, 'p', 2000);
    expect([r.kind, r.message, r.retryAfterMs]).to.deep.equal(['rate_limited', 'slow down', 2000]);
    expect(openai.failureOf(500, { detail: 'boom' }, 'p', null).message).to.equal('boom');
    expect(openai.failureOf(503, null, 'p', null)).to.include({ kind: 'http', message: 'HTTP 503' });
    expect(systemone.failureOf(400, { error: { message: 'bad state' } }, 'p', null)).to.include({ kind: 'http', message: 'bad state' });
  });

  it('recognises an error event in a stream, and nothing else', () => {
    const a = anthropic.streamError(event({ type: 'error', error: { type: 'overloaded_error', message: 'o' } }, 'error'), 'p');
    expect(a).to.include({ kind: 'overloaded', status: 529, provider: 'p' });
    expect(anthropic.streamError(event({ type: 'message_start', message: {} }, 'message_start'), 'p')).to.equal(null);
    expect(openai.streamError(event({ error: { message: 'x', code: 529 } }), 'p')).to.include({ kind: 'overloaded' });
    expect(openai.streamError(event({ error: { message: 'bad' } }), 'p')).to.include({ kind: 'http', message: 'bad' });
    expect(openai.streamError(event({ choices: [] }), 'p')).to.equal(null);
    expect(openai.streamError({ id: undefined, event: undefined, data: '[DONE]' }, 'p')).to.equal(null);
  });
});
