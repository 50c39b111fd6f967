// A counting semaphore with a FIFO queue. A released slot passes straight to the longest waiter,
// so a caller arriving meanwhile cannot take it too and push the count past `max`.

export class Semaphore {
  private active = 0;
  private readonly waiting: { wake: () => void; fail: (err: Error) => void }[] = [];

  constructor(readonly max: number) {}

  /**
   * Resolves with a release function once a slot is held. Rejects with `onTimeout()` after
   * `waitMs`, or with `onAbort()` when `signal` fires, if no slot came by then.
   */
  acquire(opts: { waitMs?: number; signal?: AbortSignal; onTimeout?: () => Error; onAbort?: () => Error } = {}): Promise<() => void> {
    if (this.active < this.max) {
      this.active++;
      return Promise.resolve(this.releaser());
    }
    if (opts.signal?.aborted) return Promise.reject(opts.onAbort?.() ?? new Error('aborted'));
    return new Promise((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const entry = {
        wake: () => {
          cleanup();
          resolve(this.releaser());
        },
        fail: (err: Error) => {
          cleanup();
          reject(err);
        },
      };
      const onAbort = () => entry.fail(opts.onAbort?.() ?? new Error('aborted'));
      const cleanup = () => {
        clearTimeout(timer);
        opts.signal?.removeEventListener('abort', onAbort);
        const i = this.waiting.indexOf(entry);
        if (i >= 0) this.waiting.splice(i, 1);
      };
      if (opts.waitMs !== undefined) timer = setTimeout(() => entry.fail(opts.onTimeout?.() ?? new Error('timed out')), opts.waitMs);
      opts.signal?.addEventListener('abort', onAbort, { once: true });
      this.waiting.push(entry);
    });
  }

  private releaser(): () => void {
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const next = this.waiting[0];
      // The slot moves to the waiter as it is: `active` stays, and nobody can slip in between.
      if (next) next.wake();
      else this.active--;
    };
  }
}
