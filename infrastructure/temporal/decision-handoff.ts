// Hands a decision's outcome from the activity that made it, in this process, straight to the HTTP
// handler waiting for it. That spares the handler the round trip through the server (completion
// persisted, then long-poll answered) that `handle.result()` takes. The server path stays as the
// fallback and carries every failure.
import type { WorkflowHandle } from '@temporalio/client';
import type { DecisionResult } from '../../activities';
import { wasStopped } from './failures';

type Settlement = { ok: true; result: DecisionResult } | { ok: false };

type Started = Pick<WorkflowHandle, 'result'> & { readonly eagerlyStarted: boolean };

export class DecisionHandoff {
  private readonly waiting = new Map<string, (s: Settlement) => void>();
  /** Decisions whose activity is deciding in this process now. */
  private readonly deciding = new Set<string>();

  /**
   * @param fallbackMs how long to wait for this process's worker before also asking the server, for
   *   the rare run that finishes elsewhere (its task moved to another worker after an eviction).
   */
  constructor(private readonly fallbackMs = 2_000) {}

  /** Starts a decision workflow with `start` and answers with its result, by the quickest path. */
  async execute(generationId: string, start: () => Promise<Started>): Promise<DecisionResult> {
    const settled = new Promise<Settlement>((resolve) => this.waiting.set(generationId, resolve));
    let timer: NodeJS.Timeout | undefined;
    try {
      const handle = await start();
      // Not eagerly started: another process's worker runs it, so only the server can tell.
      if (!handle.eagerlyStarted) return (await handle.result()) as DecisionResult;
      const viaWorker = settled.then((s) => (s.ok ? s.result : (handle.result() as Promise<DecisionResult>)));
      const viaServer = new Promise<DecisionResult>((resolve, reject) => {
        timer = setTimeout(() => handle.result().then(resolve, reject), this.fallbackMs);
      }).catch((err: unknown) => {
        // A run stopped in Temporal (terminated or cancelled by an operator) while its activity
        // decides here: that activity still decides and bills, so its answer is the client's,
        // rather than an error that invites a retry charged twice.
        if (this.deciding.has(generationId) && wasStopped(err)) return viaWorker;
        throw err;
      });
      return await Promise.race([viaWorker, viaServer]);
    } finally {
      clearTimeout(timer);
      this.waiting.delete(generationId);
    }
  }

  /**
   * The worker's side: one attempt of a decision's activity in this process. Its result goes to the
   * handler waiting here, if any; a failed attempt sends that handler to the server, which has the
   * run's outcome after its retries.
   */
  async decide(generationId: string, attempt: () => Promise<DecisionResult>): Promise<DecisionResult> {
    this.deciding.add(generationId);
    try {
      const result = await attempt();
      this.waiting.get(generationId)?.({ ok: true, result });
      return result;
    } catch (err) {
      this.waiting.get(generationId)?.({ ok: false });
      throw err;
    } finally {
      this.deciding.delete(generationId);
    }
  }

  /** Callers still waiting; zero whenever no decision is in flight. */
  get pending(): number {
    return this.waiting.size;
  }
}
