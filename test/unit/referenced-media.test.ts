// Images and documents a request names by reference, and what the hold counts for them
// (domain/completions/media.ts, estimate.ts): the body's bytes do not show what the provider bills.
import { expect } from 'chai';
import { audioFields, imageCount, referencedMedia } from '../../domain/completions/media';
import { estimateCompletionCost, promptTokensEstimate } from '../../domain/completions/estimate';
import type { CatalogModel } from '../../domain/catalog';

/** A chat model of 100,000 tokens' context with one OpenAI endpoint at `pricing`, producing at most 10 tokens. */
function chatModel(pricing: Record<string, number>): CatalogModel {
  const model = { kind: 'chat', context_length: 100_000 } as unknown as CatalogModel;
  (model as { endpoints: unknown[] }).endpoints = [
    { model, operations: ['chat'], provider: { adapter: 'openai' }, entry: { pricing, max_completion_tokens: 10 } },
  ];
  return model;
}

describe('media named by reference', () => {
  it('counts images and documents named by URL or file id in each format; inline ones are counted by their bytes instead', () => {
    const chat = {
      messages: [
        { role: 'system', content: 'be brief' },
        {
          role: 'user',
          content: [
            { type: 'text', text: 'look' },
            { type: 'image_url', image_url: { url: 'https://img.example/a.png' } },
            { type: 'image_url', image_url: { url: 'data:image/png;base64,AAAA' } },
            { type: 'file', file: { file_id: 'file-1' } },
            { type: 'file', file: { file_data: 'data:application/pdf;base64,AAAA' } },
          ],
        },
      ],
    };
    expect(referencedMedia(chat)).to.deep.equal({ images: 1, documents: 1 });
    const messages = {
      messages: [
        {
          role: 'user',
          content: [
            { type: 'image', source: { type: 'url', url: 'https://img.example/b.png' } },
            { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AAAA' } },
            { type: 'document', source: { type: 'url', url: 'https://docs.example/c.pdf' } },
            { type: 'tool_result', tool_use_id: 't', content: [{ type: 'image', source: { type: 'file', file_id: 'f' } }] },
          ],
        },
      ],
    };
    expect(referencedMedia(messages)).to.deep.equal({ images: 2, documents: 1 });
    const responses = {
      input: [
        { type: 'input_image', image_url: 'https://img.example/d.png' },
        {
          role: 'user',
          content: [
            { type: 'input_image', file_id: 'file-2' },
            { type: 'input_image', image_url: 'data:image/png;base64,AAAA' },
            { type: 'input_file', file_url: 'https://docs.example/e.pdf' },
          ],
        },
      ],
    };
    expect(referencedMedia(responses)).to.deep.equal({ images: 2, documents: 1 });
    expect(referencedMedia({ input: 'just text' })).to.deep.equal({ images: 0, documents: 0 });
  });

  it('holds an image at 2,500 tokens, a document at the whole context, and no prompt beyond the context', () => {
    const model = chatModel({ prompt: 1, completion: 1 });
    const cost = (bytes: number, images = 0, documents = 0) =>
      estimateCompletionCost([model], 'chat', { bytes, media: { images, documents } }, 10);
    expect(cost(3_000)).to.be.closeTo((1_000 + 10) / 1e6, 1e-12);
    expect(cost(3_000, 4)).to.be.closeTo((1_000 + 4 * 2_500 + 10) / 1e6, 1e-12);
    expect(cost(3_000, 0, 1)).to.be.closeTo(100_000 / 1e6, 1e-12); // the context, and no room left for output
    expect(cost(3_000, 1_000)).to.be.closeTo(100_000 / 1e6, 1e-12);
  });

  it('holds audio sent or asked for at the audio prices: all of the prompt, all of the output', () => {
    const model = chatModel({ prompt: 1, completion: 2, audio: 40, audio_completion: 80 });
    const cost = (audioIn: boolean, audioOut: boolean) =>
      estimateCompletionCost([model], 'chat', { bytes: 3_000 }, 10, 1, { tier: null, optIn: [], searches: false, audioIn, audioOut });
    expect(cost(false, false)).to.be.closeTo((1_000 + 20) / 1e6, 1e-12);
    expect(cost(true, false)).to.be.closeTo((40_000 + 20) / 1e6, 1e-12);
    expect(cost(true, true)).to.be.closeTo((40_000 + 800) / 1e6, 1e-12);
  });

  it('counts every image of a prompt, inline or by reference, in each format, a tool result’s included', () => {
    expect(
      imageCount({
        messages: [
          {
            role: 'user',
            content: [
              { type: 'image_url', image_url: { url: 'data:image/png;base64,AA==' } },
              { type: 'text', text: 'x' },
            ],
          },
          { role: 'user', content: [{ type: 'image_url', image_url: 'https://img.example/a.png' }] },
        ],
      }),
    ).to.equal(2);
    expect(
      imageCount({
        input: [
          { type: 'input_image', image_url: 'https://img.example/a.png' },
          { role: 'user', content: 'hi' },
        ],
      }),
    ).to.equal(1);
    expect(
      imageCount({
        messages: [
          {
            role: 'user',
            content: [
              { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } },
              {
                type: 'tool_result',
                tool_use_id: 't',
                content: [{ type: 'image', source: { type: 'url', url: 'https://img.example/b.png' } }],
              },
            ],
          },
        ],
      }),
    ).to.equal(2);
    expect(imageCount({ messages: [{ role: 'user', content: 'no images' }] })).to.equal(0);
  });

  it('finds where a chat request sends audio and where it asks for it back', () => {
    const part = { type: 'input_audio', input_audio: { data: 'UklGRg==', format: 'wav' } };
    expect(
      audioFields({
        messages: [
          { role: 'system', content: 'x' },
          { role: 'user', content: [{ type: 'text', text: 'hi' }, part] },
        ],
      }),
    ).to.deep.equal({
      input: 'messages[1].content[1]',
      output: null,
    });
    expect(audioFields({ messages: [], modalities: ['text', 'audio'], audio: { voice: 'alloy' } })).to.deep.equal({
      input: null,
      output: 'modalities',
    });
    expect(audioFields({ messages: [], audio: { voice: 'alloy' } })).to.deep.equal({ input: null, output: 'audio' });
    expect(audioFields({ messages: [{ role: 'user', content: 'hi' }], modalities: ['text'], audio: null })).to.deep.equal({
      input: null,
      output: null,
    });
  });

  it('bills a stream cut short before the provider counted its prompt for its text at 4 bytes a token and its media as the hold counts them', () => {
    const tokens = (bytes: number, images = 0, documents = 0) => promptTokensEstimate({ bytes, media: { images, documents } }, 100_000);
    expect(tokens(4_000)).to.equal(1_000);
    expect(tokens(4_000, 4)).to.equal(1_000 + 4 * 2_500);
    expect(tokens(4_000, 0, 1)).to.equal(100_000);
    expect(tokens(4_000, 1_000)).to.equal(100_000);
    expect(promptTokensEstimate({ bytes: 4_000 }, 100_000)).to.equal(1_000);
  });
});
