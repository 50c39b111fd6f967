// How error messages name a number of bytes: one form for every limit, quota and share.

const UNITS = [
  ['GB', 1024 ** 3],
  ['MB', 1024 ** 2],
  ['KB', 1024],
] as const;

/** Bytes in the largest unit they fill, to three significant digits: "600 MB", "64 KB", "9.95 GB", "1.5 MB", "512 bytes". */
export function sizeText(bytes: number): string {
  for (const [unit, size] of UNITS) {
    if (bytes < size) continue;
    const value = bytes / size;
    return `${Number(value.toFixed(value >= 100 ? 0 : value >= 10 ? 1 : 2))} ${unit}`;
  }
  return `${Math.round(bytes)} bytes`;
}
