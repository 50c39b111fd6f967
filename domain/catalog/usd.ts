import type { Usage } from '../../infrastructure/providers/formats';

/** USD amounts are rounded to 1e-10: float sums read as money, and a single cheap call still shows. */
export function roundUsd(n: number): number {
  return Math.round(n * 1e10) / 1e10;
}

/** USD for a call: tokens at the endpoint's per-million prices, plus its per-request price. */
export function costOf(e: { entry: { pricing: { prompt: number; completion: number; request?: number } } }, usage: Usage): number {
  const p = e.entry.pricing;
  const usd = (usage.input_tokens * p.prompt + usage.output_tokens * p.completion) / 1e6 + (p.request ?? 0);
  return roundUsd(usd);
}
