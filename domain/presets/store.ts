// Presets and their versions. Ids are name-based UUIDs (of workspace + slug, of preset + version
// number), so concurrent writers race on `_id`, the one thing every MongoDB-compatible store
// makes atomic: two creations of one slug become one preset, and two writers of version n+1
// produce one version n+1 and a 409 for the loser. The designated version is the newest.
//
// Every read is by `_id` (FerretDB reads nothing else from an index): versions are numbered without
// gaps, so the newest is found by probing version ids forward from the preset's `latest`, a hint
// that writers raise with `$max` (a lost update only leaves it lower, which costs a probe); and a
// workspace's presets are listed under it (`workspace_presets`), written before the preset.
import { fromJsonText, toJsonText } from '../../infrastructure/store/json-text';
import { createHash } from 'node:crypto';
import { ConflictError, NotFoundError } from '../../infrastructure/errors';
import type { Document } from 'mongodb';
import { isDuplicateKey, listedUnder, listUnder, type PresetDoc, type PresetVersionDoc, type Store } from '../../infrastructure/store';

/** An RFC 4122 version-5-style UUID from a name (SHA-1, as uuidv5 does). */
function nameUuid(name: string): string {
  const h = createHash('sha1').update(`inference-gateway:${name}`).digest();
  h[6] = (h[6] & 0x0f) | 0x50;
  h[8] = (h[8] & 0x3f) | 0x80;
  const x = h.subarray(0, 16).toString('hex');
  return `${x.slice(0, 8)}-${x.slice(8, 12)}-${x.slice(12, 16)}-${x.slice(16, 20)}-${x.slice(20)}`;
}

/** A preset's id: the same workspace and slug always name the same preset. */
const presetIdOf = (workspaceId: string, slug: string) => nameUuid(`${workspaceId}/${slug}`);
/** A version's id: two writers of one version number collide on it. */
const versionIdOf = (presetId: string, version: number) => nameUuid(`${presetId}#${version}`);

export interface PresetView {
  id: string;
  name: string;
  slug: string;
  description: string | null;
  status: 'active';
  status_updated_at: null;
  created_at: string;
  updated_at: string;
  creator_user_id: string;
  workspace_id: string;
  designated_version_id: string;
}

export interface VersionView {
  id: string;
  preset_id: string;
  version: number;
  config: Record<string, unknown>;
  system_prompt: string | null;
  creator_id: string;
  created_at: string;
  updated_at: string;
}

function versionView(v: PresetVersionDoc): VersionView {
  const at = v.created_at.toISOString();
  return {
    id: v._id,
    preset_id: v.preset_id,
    version: v.version,
    config: fromJsonText(v.config),
    system_prompt: v.system_prompt,
    creator_id: v.creator_id,
    created_at: at,
    updated_at: at,
  };
}

function presetView(p: PresetDoc, designated: PresetVersionDoc): PresetView & { designated_version: VersionView } {
  return {
    id: p._id,
    name: p.name,
    slug: p.slug,
    description: p.description,
    status: 'active',
    status_updated_at: null,
    created_at: p.created_at.toISOString(),
    updated_at: designated.created_at.toISOString(),
    creator_user_id: p.creator_user_id,
    workspace_id: p.workspace_id,
    designated_version_id: designated._id,
    designated_version: versionView(designated),
  };
}

/** Version ids read per probe. */
const PROBE = 16;

const versionIds = (presetId: string, from: number, count: number) =>
  Array.from({ length: count }, (_, i) => versionIdOf(presetId, from + i));

/** The newest version, probing forward from `hint` (a version known to exist, or 0). */
async function latestVersion(store: Store, presetId: string, hint = 0): Promise<PresetVersionDoc | null> {
  return newestOf(store, presetId, hint, {});
}

/** When the newest version was added, read without its config (which may be megabytes); null: it has none. */
async function latestVersionAt(store: Store, presetId: string, hint = 0): Promise<Date | null> {
  return (await newestOf(store, presetId, hint, { version: 1, created_at: 1 }))?.created_at ?? null;
}

async function newestOf(store: Store, presetId: string, hint: number, projection: Document): Promise<PresetVersionDoc | null> {
  let newest: PresetVersionDoc | null = null;
  for (let from = Math.max(hint, 1); ; from += PROBE) {
    const found = await store.presetVersions.find({ _id: { $in: versionIds(presetId, from, PROBE) } }, { projection }).toArray();
    for (const v of found) if (!newest || v.version > newest.version) newest = v;
    if (found.length < PROBE) return newest;
  }
}

/** Creates the preset if the slug is new in the workspace, then adds the next version. */
export async function addPresetVersion(
  store: Store,
  input: { workspaceId: string; slug: string; creator: string; config: Record<string, unknown>; systemPrompt: string | null },
): Promise<PresetView & { designated_version: VersionView }> {
  const now = new Date();
  const presetId = presetIdOf(input.workspaceId, input.slug);
  let preset = await store.presets.findOne({ _id: presetId });
  if (!preset) {
    await listUnder(store, 'workspace_presets', input.workspaceId, presetId, presetId);
    const doc: PresetDoc = {
      _id: presetId,
      workspace_id: input.workspaceId,
      slug: input.slug,
      name: input.slug,
      description: null,
      creator_user_id: input.creator,
      created_at: now,
      updated_at: now,
    };
    try {
      await store.presets.insertOne(doc);
      preset = doc;
    } catch (err) {
      if (!isDuplicateKey(err)) throw err;
      preset = await store.presets.findOne({ _id: presetId }); // created a moment ago by another writer
    }
  }
  const next = ((await latestVersion(store, presetId, preset?.latest))?.version ?? 0) + 1;
  const version: PresetVersionDoc = {
    _id: versionIdOf(presetId, next),
    preset_id: presetId,
    workspace_id: input.workspaceId,
    version: next,
    config: toJsonText(input.config),
    system_prompt: input.systemPrompt,
    creator_id: input.creator,
    created_at: now,
  };
  try {
    await store.presetVersions.insertOne(version);
  } catch (err) {
    if (isDuplicateKey(err)) {
      throw new ConflictError('Resource conflict: another write created this preset version at the same moment. Please try again.', {
        slug: input.slug,
        version: next,
      });
    }
    throw err;
  }
  await store.presets.updateOne({ _id: presetId }, { $max: { latest: next, updated_at: now } });
  return presetView(preset!, version);
}

export async function getPreset(
  store: Store,
  workspaceId: string,
  slug: string,
): Promise<PresetView & { designated_version: VersionView }> {
  const presetId = presetIdOf(workspaceId, slug);
  const preset = await store.presets.findOne({ _id: presetId });
  const latest = preset && (await latestVersion(store, presetId, preset.latest));
  if (!preset || !latest) throw new NotFoundError(`Preset "${slug}" not found`);
  return presetView(preset, latest);
}

/**
 * A page of the workspace's presets, most recently updated first. The order is read from the preset
 * documents, and versions (which hold the configs, up to BODY_LIMIT each) only for the page: reading
 * every preset's newest version took 2.4 s a page for 200 presets of 1 MB. A preset stored before
 * `updated_at` was kept (or whose first version has not raised `latest` yet) has its newest version's
 * time read without its config.
 */
export async function listPresets(store: Store, workspaceId: string, offset: number, limit: number) {
  const listed = await listedUnder(store, 'workspace_presets', workspaceId);
  const all = await store.presets.find({ _id: { $in: listed }, workspace_id: workspaceId }).toArray();
  const dated = await Promise.all(
    all.map(async (p) => ({ p, at: p.latest && p.updated_at ? p.updated_at : await latestVersionAt(store, p._id, p.latest) })),
  );
  const ordered = dated
    .filter((x): x is { p: PresetDoc; at: Date } => x.at !== null) // a preset whose first version was never written
    .sort((a, b) => b.at.getTime() - a.at.getTime() || a.p.slug.localeCompare(b.p.slug));
  const page = await Promise.all(
    ordered.slice(offset, offset + limit).map(async ({ p }) => ({ p, v: await latestVersion(store, p._id, p.latest) })),
  );
  return { data: page.map(({ p, v }) => presetView(p, v!)), total_count: ordered.length };
}

export async function listVersions(store: Store, workspaceId: string, slug: string, offset: number, limit: number) {
  const presetId = presetIdOf(workspaceId, slug);
  const preset = await store.presets.findOne({ _id: presetId });
  const total = preset && (await latestVersion(store, presetId, preset.latest))?.version;
  if (!total) throw new NotFoundError(`Preset "${slug}" not found`);
  const count = Math.max(0, Math.min(limit, total - offset));
  const page = count ? await store.presetVersions.find({ _id: { $in: versionIds(presetId, offset + 1, count) } }).toArray() : [];
  return { data: page.sort((a, b) => a.version - b.version).map(versionView), total_count: total };
}

export async function getVersion(store: Store, workspaceId: string, slug: string, version: number): Promise<VersionView> {
  const presetId = presetIdOf(workspaceId, slug);
  const v = await store.presetVersions.findOne({ _id: versionIdOf(presetId, version) });
  if (!v || v.workspace_id !== workspaceId) throw new NotFoundError(`Version ${version} of preset "${slug}" not found`);
  return versionView(v);
}
