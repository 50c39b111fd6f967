// Deterministic stand-ins for model output: the same request always gets the same answer, with
// plausible token counts and log-probabilities.
import { createHash } from 'node:crypto';

/** A seeded source of numbers in [0, 1), from the request itself: one hash, then mulberry32. */
export function seeded(seed: string): () => number {
  let a = createHash('sha256').update(seed).digest().readUInt32BE(0);
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 2 ** 32;
  };
}

/** JSON with object keys sorted, so the same request hashes the same whatever its key order. */
function canonical(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonical).join(',')}]`;
  if (value && typeof value === 'object') {
    return `{${Object.keys(value)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical((value as Record<string, unknown>)[k])}`)
      .join(',')}}`;
  }
  return JSON.stringify(value) ?? 'null';
}

export function hashOf(value: unknown): string {
  return createHash('sha256').update(canonical(value)).digest('hex');
}

/** About four characters a token, as common BPE tokenizers average on English. */
export function countTokens(text: string): number {
  return text.length === 0 ? 0 : Math.max(1, Math.ceil(text.length / 4));
}

export function textOf(value: unknown): string {
  if (typeof value === 'string') return value;
  if (Array.isArray(value)) return value.map(textOf).join('\n');
  if (value && typeof value === 'object') {
    const v = value as Record<string, unknown>;
    if (typeof v.text === 'string') return v.text;
    if ('content' in v) return textOf(v.content);
    return JSON.stringify(value);
  }
  return value == null ? '' : String(value);
}

const WORDS = [
  'the',
  'gateway',
  'answers',
  'with',
  'a',
  'steady',
  'deterministic',
  'reply',
  'for',
  'every',
  'request',
  'it',
  'sees',
  'sandbox',
  'model',
  'output',
];

/** `n` words of filler text chosen by the seed. */
export function sentence(rand: () => number, n: number): string {
  const out: string[] = [];
  for (let i = 0; i < n; i++) out.push(WORDS[Math.floor(rand() * WORDS.length)]);
  return out.join(' ');
}

/**
 * A distribution over `options` (most of the mass; the rest belongs to tokens outside them), as
 * natural-log probabilities, highest first.
 */
export function optionLogprobs(rand: () => number, options: string[], optionMass = 0.97): { token: string; logprob: number }[] {
  const logits = options.map(() => (rand() - 0.5) * 6);
  const max = Math.max(...logits);
  const exps = logits.map((l) => Math.exp(l - max));
  const total = exps.reduce((a, b) => a + b, 0);
  return options.map((token, i) => ({ token, logprob: Math.log((exps[i] / total) * optionMass) })).sort((a, b) => b.logprob - a.logprob);
}

/** A probability vector over n options, summing to 1. */
export function distribution(rand: () => number, n: number): number[] {
  const raw = Array.from({ length: n }, () => Math.exp((rand() - 0.5) * 6));
  const total = raw.reduce((a, b) => a + b, 0);
  return raw.map((r) => r / total);
}
