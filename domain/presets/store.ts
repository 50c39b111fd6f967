// Presets and their versions. Ids are name-based UUIDs (of workspace + slug, of preset + its life +
// version number), so concurrent writers race on `_id`, the one thing every MongoDB-compatible store
// makes atomic: two creations of one slug become one preset, and two writers of version n+1
// produce one version n+1 and a 409 for the loser. The designated version is the newest. A deleted
// preset's slug may be created again: a new life, whose versions are numbered from 1 again under
// new ids.
//
// Every read is by `_id` (FerretDB reads nothing else from an index): versions are numbered without
// gaps, so the newest is found by probing version ids forward from the preset's `latest`, a hint
// that writers raise with `$max` (a lost update only leaves it lower, which costs a probe); and a
// workspace's presets are listed under it (`workspace_presets`), written before the preset.
import { fromJsonText, toJsonText } from '../../infrastructure/store/json-text';
import { markPresetsChanged, type ListedPreset, type PresetOrder } from './list-order';
import { versionChars, type KeptVersions } from './kept-versions';
import { createHash, randomBytes } from 'node:crypto';
import { BadRequestError, ConflictError, NotFoundError } from '../../infrastructure/errors';
import type { StorageQuota } from '../accounts/storage-quota';
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
/** What names a preset's versions: its id and, for presets that have one, its life. */
type PresetLife = Pick<PresetDoc, '_id' | 'life'>;

/** A version's id: two writers of one version number collide on it. */
const versionIdOf = (preset: PresetLife, version: number) =>
  nameUuid(preset.life ? `${preset._id}/${preset.life}#${version}` : `${preset._id}#${version}`);

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

const versionIds = (preset: PresetLife, from: number, count: number) =>
  Array.from({ length: count }, (_, i) => versionIdOf(preset, from + i));

/**
 * The newest version number of each preset. Its `latest` hint is raised only once a version is
 * written, so that version exists; only the ids above it are asked for, and FerretDB reads nothing
 * for an id it does not find, where reading the hinted version (even with a projection, which it
 * applies after reading the document) cost it the whole config: ~0.2 s for one of 9.5 MB.
 */
async function newestNumbers(store: Store, presets: (PresetLife & { latest?: number })[]): Promise<Map<string, number>> {
  const newest = new Map(presets.filter((p) => p.latest).map((p) => [p._id, p.latest!]));
  let probing = presets.map((p) => ({ preset: p, from: (p.latest ?? 0) + 1, width: 2 }));
  while (probing.length) {
    const ids = probing.flatMap((p) => versionIds(p.preset, p.from, p.width));
    const found = await store.presetVersions.find({ _id: { $in: ids } }, { projection: { preset_id: 1, version: 1 } }).toArray();
    const counts = new Map<string, number>();
    for (const v of found) {
      counts.set(v.preset_id, (counts.get(v.preset_id) ?? 0) + 1);
      newest.set(v.preset_id, Math.max(newest.get(v.preset_id) ?? 0, v.version));
    }
    probing = probing
      .filter((p) => counts.get(p.preset._id) === p.width)
      .map((p) => ({ preset: p.preset, from: p.from + p.width, width: PROBE }));
  }
  return newest;
}

/** The newest version number of one preset (undefined before its first), from its `latest` hint. */
const newestNumber = async (store: Store, preset: PresetDoc): Promise<number | undefined> =>
  (await newestNumbers(store, [preset])).get(preset._id);

/**
 * Characters of configs and system prompts a page of versions or presets holds: past them the page
 * ends (always with at least one). A page of 100 versions of 9.5 MB was 950 MB: it took 27 s and a
 * 500 (a string longer than V8 allows), with the process at 1.9 GB.
 */
const PAGE_CHARS = 16 * 1024 * 1024;

/**
 * Whole versions by id, in the order asked, from `kept` or read, until what is
 * returned holds `budget` characters (at least one is returned). Ids not found are left out.
 */
async function versionsById(store: Store, ids: string[], kept?: KeptVersions, budget = Infinity): Promise<PresetVersionDoc[]> {
  const out: PresetVersionDoc[] = [];
  let chars = 0;
  // One at a time: a version's size is known only once it is read (FerretDB reads a whole document
  // even for a projection), and eight of 9.5 MB read in one go to keep one cost it 1.8 s. A listing
  // after the first finds them kept.
  for (const id of ids) {
    if (chars >= budget && out.length) break;
    const v = kept?.get(id) ?? (await store.presetVersions.findOne({ _id: id }));
    if (!v) continue;
    kept?.add(v);
    out.push(v);
    chars += versionChars(v);
  }
  return out;
}

/** Creates the preset if the slug is new in the workspace, then adds the next version. */
export async function addPresetVersion(
  store: Store,
  input: { workspaceId: string; slug: string; creator: string; config: Record<string, unknown>; systemPrompt: string | null },
  /** Where the version's size is admitted and counted (the API's); none for callers that store for no client. */
  storage?: StorageQuota,
): Promise<PresetView & { designated_version: VersionView }> {
  const now = new Date();
  const presetId = presetIdOf(input.workspaceId, input.slug);
  const config = toJsonText(input.config);
  const size = versionChars({ config, system_prompt: input.systemPrompt });
  await storage?.admit(input.workspaceId, size);
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
      life: randomBytes(8).toString('hex'),
    };
    try {
      await store.presets.insertOne(doc);
      preset = doc;
    } catch (err) {
      if (!isDuplicateKey(err)) throw err;
      preset = await store.presets.findOne({ _id: presetId }); // created a moment ago by another writer
    }
  }
  const next = ((await newestNumber(store, preset!)) ?? 0) + 1;
  const version: PresetVersionDoc = {
    _id: versionIdOf(preset!, next),
    preset_id: presetId,
    workspace_id: input.workspaceId,
    version: next,
    config,
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
  await storage?.add(input.workspaceId, size);
  const [raised] = await Promise.all([
    store.presets.updateOne({ _id: presetId }, { $max: { latest: next, updated_at: now } }),
    workspaceList(store, 'workspace_presets').updateOne(
      { _id: `${input.workspaceId}:${presetId}` },
      { $max: { updated_at: now }, $set: { slug: input.slug } },
    ),
  ]);
  if (raised.matchedCount === 0) {
    // The preset was deleted while this version was written: the version goes with it.
    if ((await store.presetVersions.deleteOne({ _id: version._id })).deletedCount) await storage?.add(input.workspaceId, -size);
    throw new ConflictError(`Preset "${input.slug}" was deleted while this version was written. Please try again.`, { slug: input.slug });
  }
  await markPresetsChanged(store, input.workspaceId); // after the entry: see list-order.ts
  return presetView(preset!, version);
}

export async function getPreset(
  store: Store,
  workspaceId: string,
  slug: string,
  kept?: KeptVersions,
): Promise<PresetView & { designated_version: VersionView }> {
  const { preset, designated } = await readDesignated(store, workspaceId, slug, kept);
  return presetView(preset, designated);
}

/** A preset's designated version as a call applies it, and what it weighs (its config's and system prompt's characters). */
export async function getDesignatedVersion(
  store: Store,
  workspaceId: string,
  slug: string,
  kept?: KeptVersions,
): Promise<{ version: VersionView; chars: number }> {
  const { designated } = await readDesignated(store, workspaceId, slug, kept);
  return { version: versionView(designated), chars: versionChars(designated) };
}

async function readDesignated(
  store: Store,
  workspaceId: string,
  slug: string,
  kept?: KeptVersions,
): Promise<{ preset: PresetDoc; designated: PresetVersionDoc }> {
  const preset = await store.presets.findOne({ _id: presetIdOf(workspaceId, slug) });
  const newest = preset && (await newestNumber(store, preset));
  const [designated] = newest ? await versionsById(store, [versionIdOf(preset, newest)], kept) : [];
  if (!preset || !designated) throw new NotFoundError(`Preset "${slug}" not found`);
  return { preset, designated };
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
 * their newest versions (which hold the configs, up to BODY_LIMIT each) are read, up to PAGE_CHARS.
 * Reading every preset to order them took FerretDB 8 s a page at 20,000 presets (MAX_PRESETS bounds
 * them now); reading every newest version took 2.4 s for 200 presets of 1 MB.
 */
export async function listPresets(
  store: Store,
  workspaceId: string,
  offset: number,
  limit: number,
  kept: { order?: PresetOrder; versions?: KeptVersions } = {},
) {
  const { order, versions } = kept;
  const entries = order ? await order.of(store, workspaceId, () => readOrder(store, workspaceId)) : await readOrder(store, workspaceId);
  const ids = entries.slice(offset, offset + limit).map((e) => e.id);
  const presets = ids.length ? await store.presets.find({ _id: { $in: ids }, workspace_id: workspaceId }).toArray() : [];
  const byId = new Map(presets.map((p) => [p._id, p]));
  const listed = ids.flatMap((id) => byId.get(id) ?? []);
  const numbers = await newestNumbers(store, listed);
  const versioned = listed.filter((p) => numbers.has(p._id)); // a preset whose first version is not written yet is left out
  const designated = await versionsById(
    store,
    versioned.map((p) => versionIdOf(p, numbers.get(p._id)!)),
    versions,
    PAGE_CHARS,
  );
  // A page PAGE_CHARS cut short ends where its versions do.
  const data = designated.map((v, i) => presetView(versioned[i], v));
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
    const undatedNumbers = await newestNumbers(store, undated);
    const undatedIds = undated.flatMap((p) => (undatedNumbers.has(p._id) ? [versionIdOf(p, undatedNumbers.get(p._id)!)] : []));
    const newestOfUndated = new Map(
      (undatedIds.length
        ? await store.presetVersions.find({ _id: { $in: undatedIds } }, { projection: { preset_id: 1, created_at: 1 } }).toArray()
        : []
      ).map((v) => [v.preset_id, v]),
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

export async function listVersions(store: Store, workspaceId: string, slug: string, offset: number, limit: number, kept?: KeptVersions) {
  const preset = await store.presets.findOne({ _id: presetIdOf(workspaceId, slug) });
  const total = preset && (await newestNumber(store, preset));
  if (!total) throw new NotFoundError(`Preset "${slug}" not found`);
  const count = Math.max(0, Math.min(limit, total - offset));
  const page = await versionsById(store, versionIds(preset, offset + 1, count), kept, PAGE_CHARS);
  return { data: page.map(versionView), total_count: total };
}

export async function getVersion(
  store: Store,
  workspaceId: string,
  slug: string,
  version: number,
  kept?: KeptVersions,
): Promise<VersionView> {
  const preset = await store.presets.findOne({ _id: presetIdOf(workspaceId, slug) });
  const [v] = preset ? await versionsById(store, [versionIdOf(preset, version)], kept) : [];
  if (!v || v.workspace_id !== workspaceId) throw new NotFoundError(`Version ${version} of preset "${slug}" not found`);
  return versionView(v);
}

/**
 * Deletes a preset and every version of it, giving their size back to the workspace's storage
 * quota. Its versions go first, one at a time (each may be megabytes; the newest last, so the
 * preset applies until it is gone), then its entry in the workspace's list, then the preset: a
 * deletion cut short (a process stopped) leaves the preset in place, and asking again finishes it.
 * A version another writer adds meanwhile goes too (looked for once the preset is gone; the writer
 * also removes it when it finds the preset gone).
 */
export async function deletePreset(store: Store, workspaceId: string, slug: string, storage?: StorageQuota): Promise<{ id: string }> {
  const preset = await store.presets.findOne({ _id: presetIdOf(workspaceId, slug) });
  if (!preset) throw new NotFoundError(`Preset "${slug}" not found`);
  let freed = 0;
  const remove = async (ids: string[]) => {
    for (const id of ids) {
      const gone = await store.presetVersions.findOneAndDelete({ _id: id });
      if (gone) freed += versionChars(gone);
    }
  };
  try {
    const newest = (await newestNumber(store, preset)) ?? 0;
    await remove(versionIds(preset, 1, newest));
    await workspaceList(store, 'workspace_presets').deleteOne({ _id: `${workspaceId}:${preset._id}` });
    await markPresetsChanged(store, workspaceId);
    await store.presets.deleteOne({ _id: preset._id });
    const late = (await newestNumbers(store, [{ _id: preset._id, life: preset.life, latest: newest }])).get(preset._id) ?? newest;
    if (late > newest) await remove(versionIds(preset, newest + 1, late - newest));
  } finally {
    if (freed) await storage?.add(workspaceId, -freed);
  }
  return { id: preset._id };
}
