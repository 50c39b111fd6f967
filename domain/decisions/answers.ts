// The answer maths (design.md §5): from a distribution over a question's options to the answer
// the interface returns. Pure functions; also used to check a native provider's answers.
import { UpstreamError } from '../../infrastructure/errors';
import type { Question, Answer } from './types';

/** Renormalizes to sum 1; an all-zero (or unusable) vector becomes uniform. */
export function normalize(p: number[]): number[] {
  const clean = p.map((x) => (Number.isFinite(x) && x > 0 ? x : 0));
  const total = clean.reduce((a, b) => a + b, 0);
  return total > 0 ? clean.map((x) => x / total) : clean.map(() => 1 / clean.length);
}

/** Index of the largest value, the first one on ties. */
function argmax(p: number[]): number {
  let best = 0;
  for (let i = 1; i < p.length; i++) if (p[i] > p[best]) best = i;
  return best;
}

/** (n·p_max − 1)/(n − 1); 1 when there is a single option. */
export function choiceConfidence(p: number[]): number {
  const n = p.length;
  if (n === 1) return 1;
  return Math.min(1, Math.max(0, (n * p[argmax(p)] - 1) / (n - 1)));
}

/** max(0, 1 − d/U) with d = Σ p_i·|i − m| around the mode m and U = ⌊n²/4⌋/n; 1 for one level. */
export function scoreConfidence(p: number[]): number {
  const n = p.length;
  if (n === 1) return 1;
  const m = argmax(p);
  const d = p.reduce((s, pi, i) => s + pi * Math.abs(i - m), 0);
  const u = Math.floor((n * n) / 4) / n;
  return Math.max(0, 1 - d / u);
}

/** The option names of a question in the order their probabilities are given. */
function optionsOf(q: Question): string[] {
  if (q.type === 'noul') return ['false', 'true'];
  if (q.type === 'choice') return Object.keys(q.criteria);
  return q.criteria.map((_, i) => String(i));
}

/** Builds the answer from a distribution over `optionsOf(q)`. */
export function answerFromDistribution(q: Question, raw: number[]): Answer {
  const p = normalize(raw);
  if (q.type === 'noul') return { type: 'noul', noul: p[1] };
  if (q.type === 'choice') {
    const labels = Object.keys(q.criteria);
    return {
      type: 'choice',
      choice: labels[argmax(p)],
      confidence: choiceConfidence(p),
      probabilities: Object.fromEntries(labels.map((l, i) => [l, p[i]])),
    };
  }
  return {
    type: 'score',
    score: p.reduce((s, pi, i) => s + i * pi, 0),
    confidence: scoreConfidence(p),
    probabilities: Object.fromEntries(p.map((pi, i) => [String(i), pi])),
    legend: Object.fromEntries(q.criteria.map((c, i) => [String(i), c])),
  };
}

/**
 * Checks and normalizes a native System One answer: the type must match, values must be numbers in
 * range; when probabilities come back, the answer is recomputed from them (renormalized) so every
 * field agrees with the formulas above.
 */
export function answerFromNative(q: Question, raw: any, name: string, provider: string): Answer {
  const bad = (why: string) =>
    new UpstreamError(`Provider ${provider} returned an invalid answer for question "${name}": ${why}`, {
      provider_name: provider,
      question: name,
    });
  if (!raw || typeof raw !== 'object') throw bad('missing');
  if (raw.type !== q.type) throw bad(`type ${JSON.stringify(raw.type)} instead of ${JSON.stringify(q.type)}`);
  const num = (v: unknown, lo: number, hi: number) => typeof v === 'number' && Number.isFinite(v) && v >= lo - 1e-9 && v <= hi + 1e-9;
  const options = optionsOf(q);
  if (raw.probabilities && typeof raw.probabilities === 'object') {
    const p = options.map((o) => raw.probabilities[o] ?? 0);
    if (!p.every((x) => num(x, 0, 1))) throw bad('probabilities must be numbers from 0 to 1');
    return answerFromDistribution(q, p);
  }
  if (q.type === 'noul') {
    if (!num(raw.noul, 0, 1)) throw bad('noul must be a number from 0 to 1');
    return { type: 'noul', noul: Math.min(1, Math.max(0, raw.noul)) };
  }
  const confidence = num(raw.confidence, 0, 1) ? { confidence: raw.confidence as number } : {};
  if (q.type === 'choice') {
    if (!options.includes(raw.choice)) throw bad(`choice ${JSON.stringify(raw.choice)} is not one of the labels`);
    return { type: 'choice', choice: raw.choice, ...confidence };
  }
  if (!num(raw.score, 0, q.criteria.length - 1)) throw bad(`score must be a number from 0 to ${q.criteria.length - 1}`);
  return { type: 'score', score: raw.score, ...confidence, legend: Object.fromEntries(q.criteria.map((c, i) => [String(i), c])) };
}
