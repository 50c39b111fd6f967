// Per-provider concurrency limits (the catalog's max_concurrency), shared by every request and
// batch line in this process. A call that cannot get a slot within its wait is a capacity failure.
import { Semaphore } from '../concurrency/semaphore';
import { UpstreamFailure } from './failure';

export class ProviderLimiter {
  private readonly semaphores = new Map<string, Semaphore>();

  acquire(provider: { slug: string; max_concurrency: number }, waitMs: number, signal?: AbortSignal): Promise<() => void> {
    let s = this.semaphores.get(provider.slug);
    if (!s) this.semaphores.set(provider.slug, (s = new Semaphore(provider.max_concurrency)));
    return s.acquire({
      waitMs,
      signal,
      onTimeout: () =>
        new UpstreamFailure(
          'capacity',
          provider.slug,
          `Provider ${provider.slug} is at its concurrency limit (${provider.max_concurrency})`,
        ),
      onAbort: () => new UpstreamFailure('aborted', provider.slug, 'Request was cancelled'),
    });
  }
}
