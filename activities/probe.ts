import type { Store } from '../infrastructure/store';

export function createProbeActivities({ store }: { store: Store }) {
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
