// Per-provider concurrency limits (the catalog's max_concurrency), shared by every request and
// batch line in this process. A call that cannot get a slot within its wait is a capacity failure.
// A freed slot goes to the waiting workspace that holds the fewest, so one workspace's queue (a large
// batch's lines) never keeps another's calls behind it. Streams, which last as long as their client
// reads, take slots only within the workspace's share, three quarters: a client that opens streams
// and stops reading them leaves the other workspaces a quarter to call the provider with. Calls
// that end by themselves (within the provider's timeout) may use every slot that is free.
import { ownerShare, Semaphore } from '../concurrency/semaphore';
import { UpstreamFailure } from './failure';

export class ProviderLimiter {
  private readonly semaphores = new Map<string, Semaphore>();

  acquire(
    provider: { slug: string; max_concurrency: number },
    call: {
      waitMs: number;
      signal?: AbortSignal;
      workspaceId?: string;
      /** A stream holds its slot as long as its client reads: it is held to the workspace's share. */
      stream: boolean;
    },
  ): Promise<() => void> {
    let s = this.semaphores.get(provider.slug);
    if (!s) this.semaphores.set(provider.slug, (s = new Semaphore(provider.max_concurrency, ownerShare(provider.max_concurrency))));
    const share = s.maxPerOwner;
    return s.acquire({
      owner: call.workspaceId,
      capped: call.stream,
      waitMs: call.waitMs,
      signal: call.signal,
      onTimeout: (capped) =>
        new UpstreamFailure(
          'capacity',
          provider.slug,
          capped
            ? `This workspace holds its share of provider ${provider.slug}'s concurrency limit (${share} of ${provider.max_concurrency} per process)`
            : `Provider ${provider.slug} is at its concurrency limit (${provider.max_concurrency})`,
        ),
      onAbort: () => new UpstreamFailure('aborted', provider.slug, 'Request was cancelled'),
    });
  }
}
