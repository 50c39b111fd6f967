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
import { markPresetsChanged, type ListedPreset, type PresetOrder } from './list-order';
import { createHash } from 'node:crypto';
import { BadRequestError, ConflictError, NotFoundError } from '../../infrastructure/errors';
import type { Document } from 'mongodb';
import {
  bulkWriteInParts,
  isDuplicateKey,
  listUnder,
  workspaceList,
  workspaceRange,
  type PresetDoc,
  type PresetVersionDoc,
  type Store,
  type WorkspaceListDoc,
} from '../../infrastructure/store';

/**
 * Presets a workspace may hold. Listing orders them all by their last update, so its cost grows with
 * their number: 20,000 took FerretDB 8 s for each page, which one workspace's key could ask for
 * over and over, slowing every other workspace's queries.
 */
export const MAX_PRESETS = 1_000;

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
  return (await newestOfMany(store, [{ id: presetId, hint }])).get(presetId) ?? null;
}

/**
 * The newest version of each preset (fields of `projection` only, if given), in one query per round:
 * first each one's hinted version and the next (the hint is rarely behind), then PROBE more for
 * those whose next exists. Versions are numbered without gaps.
 */
async function newestOfMany(
  store: Store,
  presets: { id: string; hint: number }[],
  projection?: Document,
): Promise<Map<string, PresetVersionDoc>> {
  const fields = projection && { ...projection, preset_id: 1, version: 1 };
  const newest = new Map<string, PresetVersionDoc>();
  let probing = presets.map((p) => ({ id: p.id, from: Math.max(p.hint, 1), width: 2 }));
  while (probing.length) {
    const ids = probing.flatMap((p) => versionIds(p.id, p.from, p.width));
    const found = await store.presetVersions.find({ _id: { $in: ids } }, fields && { projection: fields }).toArray();
    const counts = new Map<string, number>();
    for (const v of found) {
      counts.set(v.preset_id, (counts.get(v.preset_id) ?? 0) + 1);
      const known = newest.get(v.preset_id);
      if (!known || v.version > known.version) newest.set(v.preset_id, v);
    }
    probing = probing.filter((p) => counts.get(p.id) === p.width).map((p) => ({ id: p.id, from: p.from + p.width, width: PROBE }));
  }
  return newest;
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
    const held = await workspaceList(store, 'workspace_presets').countDocuments({ _id: workspaceRange(input.workspaceId) });
    if (held >= MAX_PRESETS) {
      throw new BadRequestError(
        `A workspace holds at most ${MAX_PRESETS} presets: add a version to an existing one, or use another workspace`,
        {
          presets: held,
        },
      );
    }
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
  await Promise.all([
    store.presets.updateOne({ _id: presetId }, { $max: { latest: next, updated_at: now } }),
    workspaceList(store, 'workspace_presets').updateOne(
      { _id: `${input.workspaceId}:${presetId}` },
      { $max: { updated_at: now }, $set: { slug: input.slug } },
    ),
  ]);
  await markPresetsChanged(store, input.workspaceId); // after the entry: see list-order.ts
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
 * A preset's entry in its workspace's list. `updated_at` (its newest version's time) and `slug` are
 * set once a version is written, so the list alone orders the presets; an entry without them (a
 * preset whose first version is not written yet, or one listed by an earlier version) is placed by
 * reading its preset.
 */
interface PresetListDoc extends WorkspaceListDoc {
  slug?: string;
  updated_at?: Date;
}

/**
 * A page of the workspace's presets, most recently updated first: the workspace's list is read in
 * one `_id` range (or its order kept by `order`, see list-order.ts), and only the page's presets and
 * their newest versions (which hold the configs, up to BODY_LIMIT each) are read. Reading every preset to order them took FerretDB 8 s a page at
 * 20,000 presets (MAX_PRESETS bounds them now); reading every newest version took 2.4 s for 200
 * presets of 1 MB.
 */
export async function listPresets(store: Store, workspaceId: string, offset: number, limit: number, order?: PresetOrder) {
  const entries = order ? await order.of(store, workspaceId, () => readOrder(store, workspaceId)) : await readOrder(store, workspaceId);
  const ids = entries.slice(offset, offset + limit).map((e) => e.id);
  const presets = ids.length ? await store.presets.find({ _id: { $in: ids }, workspace_id: workspaceId }).toArray() : [];
  const newest = await newestOfMany(
    store,
    presets.map((p) => ({ id: p._id, hint: p.latest ?? 0 })),
  );
  const byId = new Map(presets.map((p) => [p._id, p]));
  const data = ids.flatMap((id) => {
    const p = byId.get(id);
    const v = newest.get(id);
    return p && v ? [presetView(p, v)] : [];
  });
  return { data, total_count: entries.length };
}

/** The workspace's presets, most recently updated first, from its list in one `_id` range. */
async function readOrder(store: Store, workspaceId: string): Promise<ListedPreset[]> {
  const listed: PresetListDoc[] = await workspaceList(store, 'workspace_presets')
    .find({ _id: workspaceRange(workspaceId) })
    .toArray();
  const entries: ListedPreset[] = [];
  const unplaced: string[] = [];
  for (const d of listed) {
    if (d.updated_at && d.slug) entries.push({ id: d.ref, slug: d.slug, at: d.updated_at });
    else unplaced.push(d.ref);
  }
  if (unplaced.length) {
    const presets = await store.presets.find({ _id: { $in: unplaced }, workspace_id: workspaceId }).toArray();
    // A preset stored before `updated_at` was kept (or whose first version has not raised `latest`
    // yet) is placed by its newest version's time, read without its config (which may be megabytes).
    const undated = presets.filter((p) => !(p.latest && p.updated_at));
    const newestOfUndated = await newestOfMany(
      store,
      undated.map((p) => ({ id: p._id, hint: p.latest ?? 0 })),
      { created_at: 1 },
    );
    const found = presets.flatMap((p) => {
      const at = p.latest && p.updated_at ? p.updated_at : newestOfUndated.get(p._id)?.created_at;
      return at ? [{ id: p._id, slug: p.slug, at }] : []; // else no version was written
    });
    entries.push(...found);
    // Their entries keep the time from now on, so later listings read none of them (written in the
    // background: an old workspace's many would hold up this answer).
    if (found.length) {
      void bulkWriteInParts<PresetListDoc>(
        store,
        workspaceList(store, 'workspace_presets'),
        found.map((e) => ({
          updateOne: { filter: { _id: `${workspaceId}:${e.id}` }, update: { $max: { updated_at: e.at }, $set: { slug: e.slug } } },
        })),
      ).catch(() => undefined); // a later listing tries again
    }
  }
  return entries.sort((a, b) => b.at.getTime() - a.at.getTime() || a.slug.localeCompare(b.slug));
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
