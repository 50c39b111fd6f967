// The order of a workspace's presets, kept by each process between listings. Ordering reads the
// workspace's whole list, a document per preset: at 1,000 presets that took FerretDB 52 ms of a
// listing's 62, and one key within its rate limit could ask ten times a second (two thirds of a
// core). A listing now reads the workspace's mark, one `_id` read (0.5 ms), and reads the list
// again only when the mark has changed since the order was kept.
//
// Every write of a list entry is followed by a new mark: a random token, replacing the last. A
// listing reads the mark before the list, so an order kept under a mark holds every entry written
// before that mark was. A mark write lost to a concurrent one (FerretDB does not serialise updates of
// one document) leaves the other's token, which is new too. A writer that dies between its entry and
// its mark leaves kept orders stale until the next write, at most MAX_AGE_MS.
import { randomUUID } from 'node:crypto';
import type { Collection } from 'mongodb';
import type { Store } from '../../infrastructure/store';
import { SizedLru } from '../../infrastructure/concurrency/sized-lru';

export interface ListedPreset {
  id: string;
  slug: string;
  at: Date;
}

/** How long a kept order is used however its mark reads: the bound on a writer that died mid-write. */
const MAX_AGE_MS = 10_000;
/** Entries kept per process: about 15 MB, a hundred full workspaces (one of more than an eighth is not kept). */
const BUDGET_ENTRIES = 100_000;

interface MarkDoc {
  _id: string;
  token: string;
}

const marks = (store: Store): Collection<MarkDoc> => store.db.collection<MarkDoc>('workspace_preset_marks');

/** Says the workspace's list changed; after the change is written. */
export async function markPresetsChanged(store: Store, workspaceId: string): Promise<void> {
  await marks(store).replaceOne({ _id: workspaceId }, { token: randomUUID() }, { upsert: true });
}

export class PresetOrder {
  /** By workspace, sized by entries. */
  private readonly kept: SizedLru<{ mark: string; at: number; entries: ListedPreset[] }>;

  constructor(
    budget = BUDGET_ENTRIES,
    private readonly now: () => number = Date.now,
  ) {
    this.kept = new SizedLru(budget);
  }

  /** The workspace's presets in order: kept, or from `read` (which sorts them) when its mark has changed. */
  async of(store: Store, workspaceId: string, read: () => Promise<ListedPreset[]>): Promise<ListedPreset[]> {
    const mark = (await marks(store).findOne({ _id: workspaceId }))?.token ?? '';
    const kept = this.kept.get(workspaceId);
    if (kept && kept.mark === mark && this.now() - kept.at < MAX_AGE_MS) return kept.entries;
    const entries = await read();
    this.kept.set(workspaceId, { mark, at: this.now(), entries }, entries.length);
    return entries;
  }

  get heldEntries(): number {
    return this.kept.held;
  }
}
