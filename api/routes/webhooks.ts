// The workspace's webhook signing secret: read it to verify deliveries, rotate it when it leaks.
import { Type } from '@sinclair/typebox';
import { rotateWebhookSecret, webhookSecret } from '../../domain/accounts/webhook-secret';
import { authOf } from '../auth';
import { defineRoute, type AnyRoute } from '../route';
import type { AppDeps } from '../deps';

const SecretView = Type.Object({
  data: Type.Object({ secret: Type.String({ description: 'whsec_<base64>: the Standard Webhooks signing secret' }) }),
});

export function webhookRoutes({ store }: AppDeps): AnyRoute[] {
  return [
    defineRoute({
      method: 'get',
      path: '/webhooks/secret',
      tag: 'Webhooks',
      auth: 'management',
      summary: "The workspace's webhook signing secret (created on first use)",
      responses: { 200: { description: 'The secret', schema: SecretView } },
      handler: async (ctx) => {
        ctx.body = { data: { secret: await webhookSecret(store, authOf(ctx).workspaceId) } };
      },
    }),
    defineRoute({
      method: 'post',
      path: '/webhooks/secret/rotate',
      tag: 'Webhooks',
      auth: 'management',
      summary: 'Replaces the signing secret; deliveries from now on are signed with the new one',
      responses: { 200: { description: 'The new secret', schema: SecretView } },
      handler: async (ctx) => {
        ctx.body = { data: { secret: await rotateWebhookSecret(store, authOf(ctx).workspaceId) } };
      },
    }),
  ];
}
