// Token counts worked out from a request's size and what it names, for the two times the gateway
// has no count from the provider: the hold before a call and the bill for a call cut short before
// the provider reported its prompt tokens (about 4 bytes a token for text).
//
// The hold is meant to be at least the real cost, and no more than the call could really cost: one
// token per 3 bytes of prompt, plus what images and documents named by reference may count, at most
// the model's context; the priciest endpoint the call could fall back to; and as output the least of
// what the request allows, what that endpoint can produce, and what the model's context leaves after
// the prompt, for each answer asked for. An estimate far above any real cost refuses calls a
// workspace can pay for.
import type { CatalogModel } from '../catalog';
import { costOf } from '../catalog/usd';
import { servesExtras, servesOperation, type PricedExtras } from '../routing/engine';
import type { InferenceOperation } from './formats';
import { imageCount, referencedMedia, type ReferencedMedia } from './media';
import { webSearchesAllowed } from './server-tools';

/** Output allowed when neither the request nor the endpoint says. */
const DEFAULT_MAX_OUTPUT = 4096;

/**
 * The most one image a provider fetches is counted as: OpenAI's patch-based models reach ~2,490
 * tokens (1,536 patches × 1.62), Anthropic's ~1,600 (1.15 megapixels).
 */
const IMAGE_TOKENS = 2_500;

export interface PromptSize {
  /** The request's size, its preset's included. */
  bytes: number;
  /** What it names by reference: an image counts IMAGE_TOKENS; a document (a PDF of any length) the whole context. */
  media?: ReferencedMedia;
  /** The web searches its tools let the provider run, each at the endpoint's per-search price. */
  searches?: number;
  /** The images of its prompt (inline or by reference), each at the endpoint's per-image price. */
  images?: number;
}

/** What the estimates of a call (or batch line) of `body`, `bytes` long with its preset, rest on. */
export function promptSizeOf(body: Record<string, any>, bytes: number): Required<PromptSize> {
  return { bytes, media: referencedMedia(body), searches: webSearchesAllowed(body), images: imageCount(body) };
}

export function estimateCompletionCost(
  models: CatalogModel[],
  operation: InferenceOperation,
  prompt: PromptSize,
  maxOutputTokens: number | null,
  /** Answers generated, each up to the output allowed (a chat call's `n`). */
  choices = 1,
  /** What it asks for beyond tokens (a tier, web searches, audio): only endpoints priced for it may serve the call. */
  extras?: PricedExtras,
): number {
  let most = 0;
  for (const m of models) {
    const input = promptTokens(prompt, m.context_length, 3);
    for (const e of m.endpoints) {
      if (!servesOperation(e, operation) || !servesExtras(e, extras)) continue;
      const limit = e.entry.max_completion_tokens ?? DEFAULT_MAX_OUTPUT;
      const output = operation === 'embeddings' ? 0 : Math.max(0, Math.min(maxOutputTokens ?? limit, limit, m.context_length - input));
      const usage = {
        input_tokens: input,
        output_tokens: output * choices,
        web_searches: prompt.searches ?? 0,
        images: prompt.images ?? 0,
      };
      most = Math.max(most, costOf(e, usage));
      // Audio the call sends or asks for may be all of its prompt or output, at the audio prices.
      if (extras?.audioIn || extras?.audioOut) {
        const audio = { audio_input_tokens: extras.audioIn ? input : 0, audio_output_tokens: extras.audioOut ? output * choices : 0 };
        most = Math.max(most, costOf(e, { ...usage, ...audio }));
      }
    }
  }
  return most;
}

/**
 * The prompt tokens billed for a stream cut short before the provider counted them: its text at
 * about 4 bytes a token, and what it names by reference as the hold counts it.
 */
export function promptTokensEstimate(prompt: PromptSize, contextLength: number): number {
  return promptTokens(prompt, contextLength, 4);
}

/** No prompt counts beyond the context it must fit in. */
function promptTokens(prompt: PromptSize, contextLength: number, bytesPerToken: number): number {
  if (prompt.media?.documents) return contextLength;
  return Math.min(contextLength, Math.ceil(prompt.bytes / bytesPerToken) + (prompt.media?.images ?? 0) * IMAGE_TOKENS);
}
