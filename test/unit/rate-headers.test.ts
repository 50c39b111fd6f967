// The rate headers of an admitted request name the limit that binds first (api/rate-limit.ts).
import { expect } from 'chai';
import type Koa from 'koa';
import { rateLimit } from '../../api/rate-limit';
import type { AppDeps } from '../../api/deps';
import type { RateDecision } from '../../domain/accounts/rate-limit';

/** The headers an admitted request gets from these two decisions of the key's and the workspace's limits. */
async function headersFor(key: RateDecision, workspace: RateDecision): Promise<Record<string, string>> {
  const counter = { inc: () => undefined };
  const deps = {
    rateLimiter: { take: async () => key, windowSeconds: 60 },
    workspaceRequests: { take: async () => workspace, windowSeconds: 60 },
    metrics: { rateUnchecked: counter, rateLimited: counter },
  } as unknown as AppDeps;
  const headers: Record<string, string> = {};
  const ctx = { state: { auth: { keyId: 'key_1', workspaceId: 'ws_1' } }, set: (k: string, v: string) => (headers[k] = v) };
  await rateLimit(deps)(ctx as unknown as Koa.Context, async () => undefined);
  return headers;
}

const decision = (limit: number, remaining: number, unchecked = false): RateDecision => ({
  allowed: true,
  limit,
  remaining,
  resetAt: 1_800_000_000,
  retryAfterSeconds: 0,
  ...(unchecked && { unchecked: true as const }),
});

describe('rate headers', () => {
  it("name the key's limit or the workspace's, whichever has less left", async () => {
    expect((await headersFor(decision(200, 150), decision(2_000, 1_900)))['X-RateLimit-Limit']).to.equal('200');
    expect((await headersFor(decision(200, 150), decision(2_000, 100)))['X-RateLimit-Limit']).to.equal('2000');
  });

  it("never a workspace decision the database did not answer in time (before: its unknown remaining, 0, bound and named the workspace's limit)", async () => {
    const h = await headersFor(decision(200, 150), decision(2_000, 0, true));
    expect(h).to.include({ 'X-RateLimit-Limit': '200', 'X-RateLimit-Remaining': '150' });
  });
});
