// Applies the per-key and per-workspace request limits and reports the binding one on every
// authenticated response; and the per-workspace limits on what costs far more than a request counts
// for: batch creations, pages of batches or keys, bytes of bodies parsed here and of results sent.
import type Koa from 'koa';
import { RateLimitedError } from '../infrastructure/errors';
import { sizeText } from '../infrastructure/errors/sizes';
import { RateLimiter, type RateDecision } from '../domain/accounts/rate-limit';
import { closeUnread } from './body';
import type { AppDeps } from './deps';
import type { AuthContext } from './auth';
import type { Store } from '../infrastructure/store';

/** The 429 for a refused decision of `limiter`. */
function refusal(message: string, d: RateDecision, limiter: RateLimiter): RateLimitedError {
  return new RateLimitedError(message, d.retryAfterSeconds, {
    limit: d.limit,
    window_seconds: limiter.windowSeconds,
    reset_at: d.resetAt,
  });
}

export function rateLimit(deps: AppDeps): Koa.Middleware {
  return async (ctx, next) => {
    const { keyId, workspaceId } = ctx.state.auth as AuthContext;
    const key = await deps.rateLimiter.take(keyId);
    // A request the key's limit refuses takes nothing of its workspace's.
    const workspace = key.allowed ? await deps.workspaceRequests.take(`requests:${workspaceId}`) : null;
    // The headers tell the limit that binds first; a workspace decision the database did not answer
    // in time (admitted unchecked, its remaining unknown) binds nothing the key's does not.
    const d = workspace && !workspace.unchecked && workspace.remaining < key.remaining ? workspace : key;
    ctx.set('X-RateLimit-Limit', String(d.limit));
    ctx.set('X-RateLimit-Remaining', String(d.remaining));
    ctx.set('X-RateLimit-Reset', String(d.resetAt));
    if (key.unchecked || workspace?.unchecked) deps.metrics.rateUnchecked.inc();
    if (!key.allowed) {
      deps.metrics.rateLimited.inc({ scope: 'key' });
      throw refusal(
        `Rate limit exceeded: ${key.limit} requests per ${deps.rateLimiter.windowSeconds}s for this key`,
        key,
        deps.rateLimiter,
      );
    }
    if (workspace && !workspace.allowed) {
      deps.metrics.rateLimited.inc({ scope: 'workspace' });
      throw refusal(
        `Rate limit exceeded: ${workspace.limit} requests per ${deps.workspaceRequests.windowSeconds}s for this workspace, over all its keys`,
        workspace,
        deps.workspaceRequests,
      );
    }
    await next();
  };
}

/**
 * A workspace's batch creations, over all its keys: a create costs the stack ~200 chat calls' CPU,
 * so the per-key request limit does not bound what one workspace's creates take from the others.
 * Refused before the body is read.
 */
export async function admitBatchCreate(limiter: RateLimiter, ctx: Koa.Context, workspaceId: string): Promise<void> {
  const d = await limiter.take(`batches:${workspaceId}`);
  if (d.allowed) return;
  closeUnread(ctx);
  throw refusal(`Batch creation rate limit exceeded: ${d.limit} batches per ${limiter.windowSeconds}s for this workspace`, d, limiter);
}

/** What BODY_BYTES_PER_MINUTE and RESULT_BYTES_PER_MINUTE count in: a body smaller than this (nearly every call's) is not counted. */
export const LIMIT_UNIT_BYTES = 64 * 1024;

/** The 429 for a refused decision of a bytes limiter: its limit in bytes, in the message and metadata. */
function bytesRefusal(limit: string, of: string, d: RateDecision, limiter: RateLimiter, hint = ''): RateLimitedError {
  const limitBytes = d.limit * LIMIT_UNIT_BYTES;
  return new RateLimitedError(
    `${limit} exceeded: ${sizeText(limitBytes)} of ${of} per ${limiter.windowSeconds}s for this workspace, over all its keys${hint}`,
    d.retryAfterSeconds,
    { limit_bytes: limitBytes, window_seconds: limiter.windowSeconds, reset_at: d.resetAt },
  );
}

const resultsKey = (workspaceId: string) => `results:${workspaceId}`;

/** A limiter of a workspace's bytes per minute, in LIMIT_UNIT_BYTES units. */
export function bytesLimiter(store: Store, bytesPerMinute: number): RateLimiter {
  return new RateLimiter(store, Math.max(1, Math.floor(bytesPerMinute / LIMIT_UNIT_BYTES)), 60);
}

/**
 * A workspace's downloads of batch results, over all its keys: refused (before anything is read)
 * once the workspace has downloaded its RESULT_BYTES_PER_MINUTE; a download admitted runs to its
 * end, each piece counted as it is sent (`countResultBytes`), so the window's last download may
 * pass the limit by its own size, and the next is refused.
 */
export async function admitResultDownload(limiter: RateLimiter, workspaceId: string): Promise<void> {
  const d = await limiter.take(resultsKey(workspaceId));
  if (d.allowed) return;
  throw bytesRefusal('Result download limit', 'batch results', d, limiter, ' (include_results=false reads a batch without them)');
}

/** Counts the pieces of an admitted download as they are sent (never refuses: the download runs to its end). */
export async function* countResultBytes(limiter: RateLimiter, workspaceId: string, pieces: AsyncIterable<string>): AsyncGenerator<string> {
  let uncounted = 0;
  for await (const piece of pieces) {
    uncounted += piece.length;
    if (uncounted >= LIMIT_UNIT_BYTES) {
      const units = Math.floor(uncounted / LIMIT_UNIT_BYTES);
      uncounted -= units * LIMIT_UNIT_BYTES;
      void limiter.take(resultsKey(workspaceId), units).catch(() => undefined);
    }
    yield piece;
  }
}

/**
 * A workspace's bytes of bodies parsed in the API process, over all its keys: parsing holds the
 * event loop 5–13 ns a byte, so a workspace sending large bodies at its request rate held the loop
 * every other workspace shares. Checked once the body is read, before it is parsed.
 */
export async function admitBodyBytes(limiter: RateLimiter, workspaceId: string, bytes: number): Promise<void> {
  const d = await limiter.take(`bodies:${workspaceId}`, Math.floor(bytes / LIMIT_UNIT_BYTES));
  if (d.allowed) return;
  throw bytesRefusal('Request body rate limit', 'request bodies', d, limiter);
}

/**
 * A workspace's pages of batches or keys, over all its keys: a page of 100 costs the stack 20–40
 * chat calls' CPU. Refused before anything is read.
 */
export async function admitListPage(limiter: RateLimiter, workspaceId: string): Promise<void> {
  const d = await limiter.take(`lists:${workspaceId}`);
  if (d.allowed) return;
  throw refusal(
    `List rate limit exceeded: ${d.limit} pages of batches or keys per ${limiter.windowSeconds}s for this workspace, over all its keys`,
    d,
    limiter,
  );
}
