// Background re-reads the caches start on behalf of a request, run a random moment later (within
// JITTER_MS) instead of at once: at low load, a read started by a request spends its CPU while that
// request's own answer (a stream's first byte) is on its way, and the answer waits for it.

const JITTER_MS = 200;

export class Soon {
  private readonly scheduled = new Set<string>();

  /** Runs `task` within JITTER_MS, once for `key` however often it is asked meanwhile. */
  run(key: string, task: () => Promise<unknown>): void {
    if (this.scheduled.has(key)) return;
    this.scheduled.add(key);
    const timer = setTimeout(() => {
      this.scheduled.delete(key);
      task().catch(() => undefined); // a failed re-read is tried again by the next request that asks
    }, Math.random() * JITTER_MS);
    timer.unref();
  }
}
