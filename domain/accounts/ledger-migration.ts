// Brings a ledger written before running totals (domain/accounts/usage-totals) and workspace-keyed grants
// up to date, once, at start-up: usage records without a writer's stamp are summed per workspace
// into a `<workspace>:legacy` total, and each grant is copied to its `<workspace>:<id>` key before
// the old one is deleted. Every step can run again with the same outcome, so two processes starting
// together, or a start that dies half-way, leave the ledger exact; a marker then skips the scans.
import { insertManyNew, migrateOnce, type Store } from '../../infrastructure/store';
import { usageTotals } from './usage-totals';

/** Null when it had run before; else how many workspaces' records and grants it brought over. */
export function migrateLedger(store: Store): Promise<{ workspaces: number; grants: number } | null> {
  return migrateOnce(store, 'ledger-totals-1', () => migrate(store));
}

async function migrate(store: Store): Promise<{ workspaces: number; grants: number }> {
  const legacy = await store.usage
    .aggregate<{ _id: string; cost: number }>([
      { $match: { writer: { $exists: false } } },
      { $group: { _id: '$workspace_id', cost: { $sum: '$cost' } } },
    ])
    .toArray();
  if (legacy.length) {
    const now = new Date();
    await usageTotals(store).bulkWrite(
      legacy.map((w) => ({
        replaceOne: {
          filter: { _id: `${w._id}:legacy` },
          replacement: { workspace_id: w._id, writer: 'legacy', cost: w.cost, pending: null, updated_at: now },
          upsert: true,
        },
      })),
      { ordered: false },
    );
  }

  const grants = (await store.creditGrants.find({}).toArray()).filter((g) => !g._id.startsWith(`${g.workspace_id}:`));
  if (grants.length) {
    await insertManyNew(
      store.creditGrants,
      grants.map((g) => ({ ...g, _id: `${g.workspace_id}:${g._id}` })),
    );
    await store.creditGrants.deleteMany({ _id: { $in: grants.map((g) => g._id) } });
  }
  return { workspaces: legacy.length, grants: grants.length };
}
