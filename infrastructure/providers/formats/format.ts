// One provider wire format: where each operation lives, how a request is authenticated, where the
// token counts are, and what an error (an answer, or an event in a stream) means. One module per
// format implements this; the HTTP client, the routing engine and the billing code know no format.
import type { EventSourceMessage } from 'eventsource-parser';
import { UpstreamFailure } from '../failure';

/** The operations the gateway performs on providers. */
export type Operation = 'chat' | 'responses' | 'embeddings' | 'messages' | 'systemone';

export interface Usage {
  /** Every prompt token, those read from or written to the provider's prompt cache included. */
  input_tokens: number;
  output_tokens: number;
  /** Of input_tokens, those read from the provider's prompt cache (priced apart; Anthropic reports them apart). */
  cache_read_tokens?: number;
  /** Of input_tokens, those written to it. */
  cache_write_tokens?: number;
  /** Of cache_write_tokens, those written for an hour (Anthropic's 1-hour cache, priced higher). */
  cache_write_1h_tokens?: number;
  /** Web searches the provider ran for the call, billed per search. */
  web_searches?: number;
  /** Of input_tokens, audio (OpenAI's `input_audio` parts), priced apart. */
  audio_input_tokens?: number;
  /** Of output_tokens, audio (OpenAI's audio output), priced apart. */
  audio_output_tokens?: number;
  /** Images in the prompt, billed per image where the catalog prices them (counted from the request). */
  images?: number;
}

type Json = Record<string, any>;

export interface ProviderFormat {
  /** The operations this format serves, each at its path under the provider's base URL. */
  readonly paths: Partial<Record<Operation, string>>;
  /** Headers that authenticate (and version) a call; `apiKey` is absent for keyless providers. */
  headers(apiKey: string | undefined): Record<string, string>;
  /**
   * The provider tiers this format's providers bill above or below their standard prices, each with
   * the request fields that ask for it (an endpoint of a tier is always sent them).
   */
  readonly tiers: Readonly<Record<string, Record<string, string>>>;
  /** The body of a streamed call: the call's body plus whatever the format needs to report usage. */
  streamBody(operation: Operation, body: Json): Json;
  /** The token counts of an answer (or a stream chunk carrying them); 0 for what it does not say. */
  usageOf(operation: Operation, body: Json): Usage;
  /** What an error answer means: its kind (for fallback) and the provider's own words. */
  failureOf(status: number, body: unknown, provider: string, retryAfterMs: number | null): UpstreamFailure;
  /** An error sent as an event of a stream the provider accepted (null: not an error). */
  streamError(event: EventSourceMessage, provider: string): UpstreamFailure | null;
}

/** A count as a provider reports it: a non-negative integer, else 0. */
export const tokens = (v: unknown): number => (Number.isFinite(v) && (v as number) >= 0 ? Math.round(v as number) : 0);

/** Parses text as a JSON object (null when it is not one): how every stream event's data is read. */
export function jsonObject(text: string): Json | null {
  try {
    const v = JSON.parse(text);
    return v && typeof v === 'object' ? v : null;
  } catch {
    return null;
  }
}

/** Parses an event's data as a JSON object (null when it is not one). */
export const eventJson = (event: EventSourceMessage): Json | null => jsonObject(event.data);

/** The failure an error answer means, from its status and the error object's `message` and `type`. */
export function failureFrom(status: number, error: Json | null, provider: string, retryAfterMs: number | null, fallbackText?: string) {
  const message = typeof error?.message === 'string' ? error.message : (fallbackText ?? `HTTP ${status}`);
  const type = typeof error?.type === 'string' ? error.type : null;
  const kind =
    status === 529 || type === 'overloaded_error' || type === 'overloaded' ? 'overloaded' : status === 429 ? 'rate_limited' : 'http';
  return new UpstreamFailure(kind, provider, message, status, retryAfterMs);
}
