/**
 * Resolves after `ms`, or at once when `signal` aborts (never rejects: callers check the signal).
 * Its abort listener goes when it resolves either way: a chunk's signal outlives thousands of sleeps.
 */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise<void>((resolve) => {
    const done = () => {
      clearTimeout(t);
      signal?.removeEventListener('abort', done);
      resolve();
    };
    const t = setTimeout(done, ms);
    signal?.addEventListener('abort', done, { once: true });
  });
}
