// Hands a decision's outcome from the in-process worker straight to the HTTP handler waiting for
// it. The workflow reports its result through a sink as soon as it has it, which spares the
// handler the round trip through the server (completion persisted, then long-poll answered) that
// `handle.result()` takes. The server path stays as the fallback and carries every failure.
import type { WorkflowHandle } from '@temporalio/client';
import type { InjectedSinks } from '@temporalio/worker';
import type { DecisionResult } from '../../activities';
import type { DecisionSinks } from '../../workflows/decision';

type Settlement = { ok: true; result: DecisionResult } | { ok: false };

type Started = Pick<WorkflowHandle, 'result'> & { readonly eagerlyStarted: boolean };

export class DecisionHandoff {
  private readonly waiting = new Map<string, (s: Settlement) => void>();

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
      const viaServer = new Promise<DecisionResult>((resolve, reject) => {
        timer = setTimeout(() => handle.result().then(resolve, reject), this.fallbackMs);
      });
      const viaSink = settled.then((s) => (s.ok ? s.result : (handle.result() as Promise<DecisionResult>)));
      return await Promise.race([viaSink, viaServer]);
    } finally {
      clearTimeout(timer);
      this.waiting.delete(generationId);
    }
  }

  /** Wakes the caller of `execute` for this generation, if it is still waiting (it forgets it). */
  private settle(generationId: string, s: Settlement): void {
    this.waiting.get(generationId)?.(s);
  }

  /** The worker's side. Not called on replay: a replayed run's caller has been answered already. */
  sinks(): InjectedSinks<DecisionSinks> {
    return {
      decisions: {
        answered: { fn: (_info, generationId, result) => this.settle(generationId, { ok: true, result }), callDuringReplay: false },
        failed: { fn: (_info, generationId) => this.settle(generationId, { ok: false }), callDuringReplay: false },
      },
    };
  }

  /** Callers still waiting; zero whenever no decision is in flight. */
  get pending(): number {
    return this.waiting.size;
  }
}
