// `gateway recover-batches`: after Temporal lost its state (a dev server's database file or a
// volume gone, a namespace recreated), every open batch's run is gone with it and the batch would
// stay open for good. This gives each open batch without a run a new one, which goes on from where
// its chunks stopped (their progress documents are in MongoDB): nothing finished runs again. A batch
// whose run an operator stopped is closed cancelled instead (see BatchRuns.recover).
// An operator's command, run once: it reads every workspace's open batches. A worker process runs
// it by itself when it finds that Temporal's state is new (`recoverIfTemporalIsNew`).
import type { Client } from '@temporalio/client';
import { insertManyNew, type Store } from '../infrastructure/store';
import type { Config } from '../infrastructure/config';
import type { Logger } from '../infrastructure/log';
import type { BatchRuns, RunState } from '../api/batch-runs';
import { answeredWithin } from '../infrastructure/temporal/failures';
import { listWorkspaces } from '../domain/accounts/workspaces';
import { listBatches } from '../domain/batches/store';
import { OPEN_STATUSES } from '../domain/batches/schema';
const PAGE = 100;

export interface Recovered {
  checked: number;
  running: number;
  /** Batches given a new run, which goes on where their chunks stopped. */
  started: string[];
  /** Batches whose run an operator stopped (terminated or cancelled in Temporal), closed cancelled by a new run. */
  cancelled: string[];
  /** Batches whose run had ended by itself meanwhile (closed). */
  ended: string[];
}

export async function recoverBatches(
  store: Store,
  runs: BatchRuns,
  opts: { workspace?: string; signal?: AbortSignal } = {},
): Promise<Recovered> {
  const out: Recovered = { checked: 0, running: 0, started: [], cancelled: [], ended: [] };
  const workspaces = opts.workspace ? [opts.workspace] : (await listWorkspaces(store)).map((w) => w._id);
  for (const workspaceId of workspaces) {
    for (let after: string | undefined; !opts.signal?.aborted;) {
      const page = await listBatches(store, workspaceId, { after, statuses: OPEN_STATUSES, limit: PAGE });
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

/** What the command prints without --json. */
export function recoveredText(r: Recovered): string {
  const ids = (list: string[]) => list.map((id) => `\n  ${id}`).join('');
  return [
    `${r.checked} open batch(es): ${r.running} running, ${r.started.length} given a new run${ids(r.started)}`,
    r.cancelled.length ? `\n${r.cancelled.length} closed cancelled, their runs stopped in Temporal${ids(r.cancelled)}` : '',
    r.ended.length ? `\n${r.ended.length} closed meanwhile` : '',
  ].join('');
}

/** The identities of Temporal namespaces this database has run batches on: one per state, so one more per reset. */
interface TemporalStateDoc {
  _id: string; // `<namespace>:<namespace id>`
  seen_at: Date;
}

/**
 * Run by each worker process as it starts, in the background. A namespace gets a new id each time
 * it is created (a fresh dev server database, a lost volume, a recreated namespace): an id this
 * database has not run batches on means Temporal's state is new, and the open batches' workflows
 * went with the old one. They are given new runs, and only then is the id recorded, so a process
 * stopped part way leaves the next start to do it again (several processes at once do no harm: a
 * batch gets one new run). A database that has recorded no id (its first start, or an older
 * version's) only records it.
 */
export async function recoverIfTemporalIsNew(
  store: Store,
  client: Client,
  runs: BatchRuns,
  config: Config,
  logger: Logger,
  signal: AbortSignal,
): Promise<void> {
  const namespace = config.temporal.namespace;
  try {
    const { namespaceInfo } = await answeredWithin(client.workflowService.describeNamespace({ namespace }), config.temporal.answerWithinMs);
    if (!namespaceInfo?.id) return;
    const states = store.db.collection<TemporalStateDoc>('temporal_states');
    const current = `${namespace}:${namespaceInfo.id}`;
    const known = await states.find({ _id: { $gt: `${namespace}:`, $lt: `${namespace}:~` } }).toArray();
    if (known.some((s) => s._id === current)) return;
    if (known.length) {
      const r = await recoverBatches(store, runs, { signal });
      if (signal.aborted) return;
      logger.info(
        { checked: r.checked, started: r.started.length, cancelled: r.cancelled.length, ended: r.ended.length },
        `Temporal's state is new (namespace ${namespace} has a new id): ${r.started.length} open batch(es) from before given a new run`,
      );
    }
    await insertManyNew(states, [{ _id: current, seen_at: new Date() }]);
  } catch (err) {
    // The gateway serves all the same; the next start, or the operator, does it again.
    logger.warn({ err }, "open batches were not checked for runs lost with Temporal's state: run `gateway recover-batches`");
  }
}
