// Per-provider concurrency limits (the catalog's max_concurrency), shared by every request and
// batch line in this process. A call that cannot get a slot within its wait is a capacity failure.
import { UpstreamFailure } from './failure';

class Semaphore {
  private active = 0;
  private readonly waiting: (() => void)[] = [];
  constructor(readonly max: number) {}

  async acquire(waitMs: number, signal: AbortSignal | undefined, provider: string): Promise<() => void> {
    if (this.active < this.max) {
      this.active++;
      return this.releaser();
    }
    await new Promise<void>((resolve, reject) => {
      const wake = () => { cleanup(); resolve(); };
      const timer = setTimeout(() => { cleanup(); reject(new UpstreamFailure('capacity', provider, `Provider ${provider} is at its concurrency limit (${this.max})`)); }, waitMs);
      const onAbort = () => { cleanup(); reject(new UpstreamFailure('aborted', provider, 'Request was cancelled')); };
      const cleanup = () => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        const i = this.waiting.indexOf(wake);
        if (i >= 0) this.waiting.splice(i, 1);
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      this.waiting.push(wake);
    });
    this.active++;
    return this.releaser();
  }

  private releaser(): () => void {
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.active--;
      this.waiting.shift()?.();
    };
  }
}

export class ProviderLimiter {
  private readonly semaphores = new Map<string, Semaphore>();

  acquire(provider: { slug: string; max_concurrency: number }, waitMs: number, signal?: AbortSignal): Promise<() => void> {
    let s = this.semaphores.get(provider.slug);
    if (!s) this.semaphores.set(provider.slug, (s = new Semaphore(provider.max_concurrency)));
    return s.acquire(waitMs, signal, provider.slug);
  }
}
