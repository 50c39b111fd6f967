/** USD amounts are rounded to 1e-10: float sums read as money, and a single cheap call still shows. */
export function roundUsd(n: number): number {
  return Math.round(n * 1e10) / 1e10;
}
