// Activities hold all I/O. They are built by a factory from their dependencies and are idempotent:
// a retry after a crash rewrites the same `_id`, never a second document.
import type { Store } from '../store';
import type { Upstreams } from '../routing/upstreams';

export interface ActivityDeps {
  store: Store;
  upstreams: Upstreams;
}

export function createActivities({ store }: ActivityDeps) {
  return {
    async writeProbe(id: string, note: string): Promise<void> {
      await store.probes.replaceOne({ _id: id }, { _id: id, note, written_at: new Date() }, { upsert: true });
    },

    async readProbe(id: string): Promise<{ id: string; note: string }> {
      const doc = await store.probes.findOne({ _id: id });
      if (!doc) throw new Error(`probe ${id} was not found after writing it`);
      return { id: doc._id, note: doc.note };
    },
  };
}

export type Activities = ReturnType<typeof createActivities>;
