// The caller's own key, its workspace's keys, credits and storage, and generation lookups. Every query is
// scoped to the authenticated workspace: another workspace's objects are simply not found.
import { Type } from '@sinclair/typebox';
import { createKey, KEY_STORED_BYTES, keyOfWorkspace, keysPage, publicKey, revokeKey } from '../../domain/accounts/keys';
import { NotFoundError } from '../../infrastructure/errors';
import { usageDetails, type BilledExtra } from '../../domain/accounts/usage-ledger';
import { authOf } from '../auth';
import { admitListPage } from '../rate-limit';
import { defineRoute, type AnyRoute } from '../route';
import { CursorPage, cursorPage, ErrorEnvelope } from '../../infrastructure/validation/types';
import {
  CreateKeyBody,
  Credits,
  CurrentKey,
  Generation,
  GenerationQuery,
  KeyIdParams,
  ListKeysQuery,
  PublicKey,
  Storage,
} from '../../domain/accounts/schema';
import type { AppDeps } from '../deps';

export function accountRoutes({ store, rateLimiter, workspaceRequests, listPages, keys, workspaces, usage, storage }: AppDeps): AnyRoute[] {
  return [
    defineRoute({
      method: 'get',
      path: '/key',
      tag: 'Keys',
      auth: 'any',
      summary: "The authenticating key, its workspace's usage, and the rate limits of the key and of its workspace",
      responses: { 200: { description: 'Current key', schema: CurrentKey } },
      handler: async (ctx) => {
        const auth = authOf(ctx);
        const balance = await workspaces.balance(auth.workspaceId);
        const limit = (l: typeof rateLimiter) => ({ requests: l.limit, interval: `${l.windowSeconds}s` });
        ctx.body = {
          data: {
            id: auth.keyId,
            label: auth.label,
            name: auth.name,
            kind: auth.kind,
            workspace_id: auth.workspaceId,
            usage: balance.total_usage,
            limit: null,
            is_free_tier: false,
            rate_limit: limit(rateLimiter),
            workspace_rate_limit: limit(workspaceRequests),
          },
        };
      },
    }),
    defineRoute({
      method: 'get',
      path: '/credits',
      tag: 'Credits',
      auth: 'any',
      summary: "The workspace's credits, usage and balance (USD); other gateway processes' spending shows within BALANCE_CACHE_MS",
      responses: { 200: { description: 'Credits', schema: Credits } },
      handler: async (ctx) => {
        ctx.body = { data: await workspaces.balance(authOf(ctx).workspaceId) };
      },
    }),
    defineRoute({
      method: 'get',
      path: '/storage',
      tag: 'Credits',
      auth: 'any',
      summary: 'What the workspace stores of batch inputs, preset versions and keys, and its quota (bytes)',
      responses: { 200: { description: 'Storage', schema: Storage } },
      handler: async (ctx) => {
        ctx.body = { data: { stored_bytes: await storage.stored(authOf(ctx).workspaceId), quota_bytes: storage.quotaBytes } };
      },
    }),
    defineRoute({
      method: 'get',
      path: '/keys',
      tag: 'Keys',
      auth: 'management',
      query: ListKeysQuery,
      summary: "The workspace's API keys, revoked ones included, a page at a time in creation order (management keys only)",
      responses: {
        200: {
          description: 'A page of keys',
          schema: CursorPage(PublicKey),
        },
      },
      handler: async (ctx, { query }) => {
        await admitListPage(listPages, authOf(ctx).workspaceId);
        const page = await keysPage(store, authOf(ctx).workspaceId, { after: query.after, limit: query.limit });
        ctx.body = cursorPage(page.keys, page.hasMore, page.last);
      },
    }),
    defineRoute({
      method: 'post',
      path: '/keys',
      tag: 'Keys',
      auth: 'management',
      body: CreateKeyBody,
      summary: 'Create an API key in this workspace; the key itself is shown only in this response',
      responses: {
        201: { description: 'Created', schema: Type.Object({ data: PublicKey, key: Type.String() }) },
        402: { description: 'The workspace stores its quota of batch inputs, preset versions and keys', schema: ErrorEnvelope },
      },
      handler: async (ctx, { body }) => {
        const { workspaceId } = authOf(ctx);
        await storage.admit(workspaceId, KEY_STORED_BYTES);
        const { key, ...data } = await createKey(store, workspaceId, { kind: body.kind ?? 'inference', name: body.name });
        await storage.add(workspaceId, KEY_STORED_BYTES);
        ctx.status = 201;
        ctx.body = { data, key };
      },
    }),
    defineRoute({
      method: 'get',
      path: '/keys/:id',
      tag: 'Keys',
      auth: 'management',
      params: KeyIdParams,
      summary: 'One API key of this workspace',
      responses: { 200: { description: 'Key', schema: Type.Object({ data: PublicKey }) } },
      handler: async (ctx, { params }) => {
        const doc = await keyOfWorkspace(store, authOf(ctx).workspaceId, params.id);
        if (!doc) throw new NotFoundError(`API key ${params.id} not found`);
        ctx.body = { data: publicKey(doc) };
      },
    }),
    defineRoute({
      method: 'delete',
      path: '/keys/:id',
      tag: 'Keys',
      auth: 'management',
      params: KeyIdParams,
      summary: 'Revoke an API key of this workspace (its usage records stay)',
      responses: { 200: { description: 'Revoked', schema: Type.Object({ data: PublicKey, deleted: Type.Literal(true) }) } },
      handler: async (ctx, { params }) => {
        const data = await revokeKey(store, params.id, authOf(ctx).workspaceId);
        keys.forget(data.id);
        ctx.body = { data, deleted: true };
      },
    }),
    defineRoute({
      method: 'get',
      path: '/generation',
      tag: 'Generations',
      auth: 'any',
      query: GenerationQuery,
      summary: 'Usage and cost of one generation (a decision, or a batch line)',
      responses: { 200: { description: 'Generation', schema: Generation } },
      handler: async (ctx, { query }) => {
        const doc = await usage.generation(authOf(ctx).workspaceId, query.id);
        if (!doc) throw new NotFoundError(`Generation ${query.id} not found`);
        const details = usageDetails(doc) ?? {};
        const count = (k: BilledExtra) => (Number.isInteger(details[k]) ? (details[k] as number) : 0);
        ctx.body = {
          data: {
            id: doc._id,
            model: doc.model,
            provider_name: doc.provider,
            tokens_prompt: doc.input_tokens,
            tokens_completion: doc.output_tokens,
            tokens_cache_read: count('cache_read_tokens'),
            tokens_cache_write: count('cache_write_tokens'),
            tokens_cache_write_1h: count('cache_write_1h_tokens'),
            web_searches: count('web_searches'),
            tokens_audio_prompt: count('audio_input_tokens'),
            tokens_audio_completion: count('audio_output_tokens'),
            images: count('images'),
            total_cost: doc.cost,
            created_at: doc.created_at.toISOString(),
            session_id: doc.session_id ?? null,
            user: doc.user ?? null,
            app_title: doc.app?.title ?? null,
            app_referer: doc.app?.referer ?? null,
            batch_id: doc.batch_id ?? null,
          },
        };
      },
    }),
  ];
}
