// API keys. A key is 256 random bits shown once; only its SHA-256 is stored (a slow password hash
// buys nothing against keys this long, and authentication stays one `_id` lookup).
import { hash, randomBytes } from 'node:crypto';
import { NotFoundError } from '../../infrastructure/errors';
import { inIdOrder, listUnder, workspaceList, type ApiKeyDoc, type KeyKind, type Store } from '../../infrastructure/store';

const KEY_PREFIX = 'sk-gw-v1-';
const KEY_SHAPE = /^sk-gw-v1-[0-9a-f]{64}$/;

/** One-shot `hash()`: a third of `createHash()`'s CPU (0.27 against 0.84 µs), on every authenticated request. */
function hashKey(key: string): string {
  return hash('sha256', key, 'hex');
}

export interface PublicKey {
  id: string;
  workspace_id: string;
  kind: KeyKind;
  name: string;
  label: string;
  created_at: string;
  revoked_at: string | null;
}

export function publicKey(doc: ApiKeyDoc): PublicKey {
  return {
    id: doc.id,
    workspace_id: doc.workspace_id,
    kind: doc.kind,
    name: doc.name,
    label: doc.label,
    created_at: doc.created_at.toISOString(),
    revoked_at: doc.revoked_at?.toISOString() ?? null,
  };
}

/**
 * `key_` + the creation time (12 hex digits of ms) + 48 random bits: a workspace's keys are listed
 * in `_id` order a page at a time, which is then their creation order. Ids made before this were all
 * random (same shape): they sort among the rest by chance.
 */
function newKeyId(): string {
  // Never the same millisecond twice in a process, so keys made in one burst keep their order.
  lastKeyMs = Math.max(Date.now(), lastKeyMs + 1);
  return `key_${lastKeyMs.toString(16).padStart(12, '0')}${randomBytes(6).toString('hex')}`;
}
let lastKeyMs = 0;

/**
 * What a key takes stored, counted in its workspace's storage quota: its document and its list
 * entry (up to 522 bytes, with a name of 100 characters). Keys are kept for good, revoked ones
 * too, and a workspace within its request limits could otherwise make 8 million a day.
 */
export const KEY_STORED_BYTES = 600;

/** Creates a key; the returned `key` is the only time the secret exists outside the caller. */
export async function createKey(
  store: Store,
  workspaceId: string,
  opts: { kind: KeyKind; name?: string },
): Promise<PublicKey & { key: string }> {
  const key = KEY_PREFIX + randomBytes(32).toString('hex');
  const doc: ApiKeyDoc = {
    _id: hashKey(key),
    id: newKeyId(),
    workspace_id: workspaceId,
    kind: opts.kind,
    name: opts.name ?? `${opts.kind} key`,
    label: `${key.slice(0, KEY_PREFIX.length + 6)}…${key.slice(-4)}`,
    created_at: new Date(),
    revoked_at: null,
  };
  await listUnder(store, 'workspace_keys', workspaceId, doc.id, doc._id);
  await store.apiKeys.insertOne(doc);
  return { ...publicKey(doc), key };
}

/** The stored id (SHA-256) of a well-formed token; null for anything that cannot be a key. */
export function tokenHash(token: string): string | null {
  return KEY_SHAPE.test(token) ? hashKey(token) : null;
}

/** The records of the live keys among `hashes`, by hash. */
export async function liveKeysByHash(store: Store, hashes: string[]): Promise<Map<string, ApiKeyDoc>> {
  const docs = await store.apiKeys.find({ _id: { $in: hashes } }).toArray();
  return new Map(docs.filter((d) => !d.revoked_at).map((d) => [d._id, d]));
}

/**
 * A page of the workspace's keys in id order after `after`: its list read as an `_id` range up to
 * the page's end, then those keys by `_id`. Reading the whole list did not scale: 20,000 keys took
 * 9 s, most of it FerretDB answering an `$in` of 20,000 ids.
 */
export async function keysPage(
  store: Store,
  workspaceId: string,
  { after, limit }: { after?: string; limit: number },
): Promise<{ keys: PublicKey[]; last: string | null; hasMore: boolean }> {
  const listed = await inIdOrder(
    store,
    workspaceList(store, 'workspace_keys')
      .find({ _id: { $gt: `${workspaceId}:${after ?? ''}`, $lt: `${workspaceId}:~` } })
      .limit(limit + 1),
  ).toArray();
  const page = listed.slice(0, limit);
  const docs = page.length ? await store.apiKeys.find({ _id: { $in: page.map((d) => d.ref) }, workspace_id: workspaceId }).toArray() : [];
  // The cursor is the page's last listed id: a key listed but never written (a crash between the two) is passed over.
  const last = page.length ? page[page.length - 1]._id.slice(workspaceId.length + 1) : null;
  return { keys: docs.sort((a, b) => (a.id < b.id ? -1 : 1)).map(publicKey), last, hasMore: listed.length > limit };
}

/** Every key of a workspace (page by page), or every key: for the admin CLI. */
export async function listKeys(store: Store, workspaceId?: string): Promise<PublicKey[]> {
  if (!workspaceId)
    return (await store.apiKeys.find({}).toArray()).sort((a, b) => a.created_at.getTime() - b.created_at.getTime()).map(publicKey);
  const all: PublicKey[] = [];
  let after: string | undefined;
  for (;;) {
    const page = await keysPage(store, workspaceId, { after, limit: 100 });
    all.push(...page.keys);
    if (!page.hasMore) return all;
    after = page.last!;
  }
}

/**
 * Revokes a key. With a workspace given, a key of another workspace is "not found": callers never
 * learn that it exists.
 */
export async function revokeKey(store: Store, id: string, workspaceId?: string): Promise<PublicKey> {
  // The admin CLI names a key without its workspace: a whole read, fine for an operator's command.
  const doc = workspaceId ? await keyOfWorkspace(store, workspaceId, id) : await store.apiKeys.findOne({ id });
  if (!doc) throw new NotFoundError(`API key ${id} not found`);
  if (!doc.revoked_at) {
    doc.revoked_at = new Date();
    await store.apiKeys.updateOne({ _id: doc._id }, { $set: { revoked_at: doc.revoked_at } });
  }
  return publicKey(doc);
}

/** One key of a workspace, or null (another workspace's key is not found either). */
export async function keyOfWorkspace(store: Store, workspaceId: string, id: string): Promise<ApiKeyDoc | null> {
  const listed = await workspaceList(store, 'workspace_keys').findOne({ _id: `${workspaceId}:${id}` });
  const doc = listed && (await store.apiKeys.findOne({ _id: listed.ref }));
  return doc && doc.workspace_id === workspaceId && doc.id === id ? doc : null;
}
