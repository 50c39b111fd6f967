// First start on an empty database: a `default` workspace with welcome credits and one management
// key, printed once, so a new user can make a first call straight away.
import { createKey } from './keys';
import { grantCredits } from './credits';
import { createWorkspace } from './workspaces';
import type { Store } from '../../infrastructure/store';

export async function bootstrapIfEmpty(store: Store, welcomeUsd: number): Promise<{ workspaceId: string; key: string } | null> {
  if (await store.workspaces.findOne({})) return null;
  let workspace;
  try {
    workspace = await createWorkspace(store, 'default');
  } catch {
    return null; // another process won the race and printed the key
  }
  await grantCredits(store, workspace._id, welcomeUsd, 'welcome credits');
  const { key } = await createKey(store, workspace._id, { kind: 'management', name: 'first management key' });
  return { workspaceId: workspace._id, key };
}
