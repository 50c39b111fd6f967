// Each workspace's webhook signing secret: created on first use (the first writer wins, so two
// concurrent first uses agree), readable and rotatable by a management key.
import { NotFoundError } from '../../infrastructure/errors';
import type { Store } from '../../infrastructure/store';
import { newWebhookSecret } from '../webhooks/signature';

export async function webhookSecret(store: Store, workspaceId: string): Promise<string> {
  const read = async () => (await store.workspaces.findOne({ _id: workspaceId }, { projection: { webhook_secret: 1 } }))?.webhook_secret;
  const existing = await read();
  if (existing) return existing;
  // First use: only a workspace without one gets this secret, so concurrent first uses read the same.
  await store.workspaces.updateOne(
    { _id: workspaceId, webhook_secret: { $exists: false } },
    { $set: { webhook_secret: newWebhookSecret() } },
  );
  const made = await read();
  if (!made) throw new NotFoundError('Workspace not found');
  return made;
}

export async function rotateWebhookSecret(store: Store, workspaceId: string): Promise<string> {
  const secret = newWebhookSecret();
  const r = await store.workspaces.updateOne({ _id: workspaceId }, { $set: { webhook_secret: secret } });
  if (!r.matchedCount) throw new NotFoundError('Workspace not found');
  return secret;
}
