// `gateway recover-batches`: after Temporal lost its state (a dev server's database file or a
// volume gone, a namespace recreated), every open batch's run is gone with it and the batch would
// stay open for good. This gives each open batch without a run a new one, which goes on from where
// its chunks stopped (their progress documents are in MongoDB): nothing finished runs again.
// An operator's command, run once: it reads every workspace's open batches.
import type { Store } from '../infrastructure/store';
import type { BatchRuns, RunState } from '../api/batch-runs';
import { listWorkspaces } from '../domain/accounts/workspaces';
import { listBatches, type BatchStatus } from '../domain/batches/store';

const OPEN: BatchStatus[] = ['validating', 'in_progress', 'finalizing', 'cancelling'];
const PAGE = 100;

export interface Recovered {
  checked: number;
  running: number;
  /** Batches given a new run. */
  started: string[];
  /** Batches whose run had ended by itself meanwhile (closed). */
  ended: string[];
}

export async function recoverBatches(
  store: Store,
  runs: BatchRuns,
  opts: { workspace?: string; signal?: AbortSignal } = {},
): Promise<Recovered> {
  const out: Recovered = { checked: 0, running: 0, started: [], ended: [] };
  const workspaces = opts.workspace ? [opts.workspace] : (await listWorkspaces(store)).map((w) => w._id);
  for (const workspaceId of workspaces) {
    for (let after: string | undefined; !opts.signal?.aborted;) {
      const page = await listBatches(store, workspaceId, { after, statuses: OPEN, limit: PAGE });
      for (const b of page.slice(0, PAGE)) {
        if (opts.signal?.aborted) break;
        out.checked++;
        const state: RunState = await runs.recover(b);
        if (state === 'running') out.running++;
        else out[state].push(b._id);
      }
      if (page.length <= PAGE) break;
      after = page[PAGE - 1]._id;
    }
  }
  return out;
}
