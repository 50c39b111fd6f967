// Workspaces: the unit of isolation. Every key, preset, batch and usage record belongs to one.
import { randomUUID } from 'node:crypto';
import { ConflictError, NotFoundError } from '../../infrastructure/errors';
import { isDuplicateKey, type Store, type WorkspaceDoc } from '../../infrastructure/store';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

export async function createWorkspace(store: Store, name: string): Promise<WorkspaceDoc> {
  const doc: WorkspaceDoc = { _id: randomUUID(), name, created_at: new Date(), settings: {} };
  try {
    await store.workspaces.insertOne(doc);
  } catch (err) {
    if (isDuplicateKey(err)) throw new ConflictError(`A workspace named "${name}" already exists`);
    throw err;
  }
  return doc;
}

/** Accepts a workspace id or its name, as the CLI does. */
export async function findWorkspace(store: Store, nameOrId: string): Promise<WorkspaceDoc> {
  const doc = UUID.test(nameOrId)
    ? await store.workspaces.findOne({ _id: nameOrId.toLowerCase() })
    : await store.workspaces.findOne({ name: nameOrId });
  if (!doc) throw new NotFoundError(`Workspace ${JSON.stringify(nameOrId)} not found`);
  return doc;
}

export async function listWorkspaces(store: Store): Promise<WorkspaceDoc[]> {
  return store.workspaces.find({}).sort({ created_at: 1 }).toArray();
}
