// Hands a decision's outcome from the activity that made it, in this process, straight to the HTTP
// handler waiting for it. That spares the handler the round trip through the server (completion
// persisted, then long-poll answered) that `handle.result()` takes. The server path stays as the
// fallback and carries every failure.
import type { WorkflowHandle } from '@temporalio/client';
import { ApplicationFailure } from '@temporalio/common';
import type { DecisionResult } from '../../activities';
import { RecentlyUsed } from '../concurrency/recently-used';

/** How long a decision's run may last (its workflow execution timeout): no attempt starts later. */
export const DECISION_RUN_TIMEOUT_MS = 3 * 60_000;

type Settlement = { ok: true; result: DecisionResult } | { ok: false };

type Started = Pick<WorkflowHandle, 'result'> & { readonly eagerlyStarted: boolean };

export class DecisionHandoff {
  private readonly waiting = new Map<string, (s: Settlement) => void>();
  /** Decisions whose activity is deciding in this process now. */
  private readonly deciding = new Set<string>();
  /** Decisions answered here with an error, kept as long as their run could still try again. */
  private readonly refused: RecentlyUsed<true>;

  /**
   * @param fallbackMs how long to wait for this process's worker before also asking the server, for
   *   the rare run that finishes elsewhere (its task moved to another worker after an eviction).
   * @param refusedForMs how long a decision answered here with an error refuses further attempts:
   *   at least as long as its run may last.
   */
  constructor(
    private readonly fallbackMs = 2_000,
    refusedForMs = DECISION_RUN_TIMEOUT_MS,
  ) {
    this.refused = new RecentlyUsed<true>({ idleMs: refusedForMs });
  }

  /** Starts a decision workflow with `start` and answers with its result, by the quickest path. */
  async execute(generationId: string, start: () => Promise<Started>): Promise<DecisionResult> {
    let next = this.awaitAttempt(generationId);
    let timer: NodeJS.Timeout | undefined;
    try {
      const handle = await start();
      // Not eagerly started: another process's worker runs it, so only the server can tell.
      if (!handle.eagerlyStarted) return (await handle.result()) as DecisionResult;
      const viaServer = async (): Promise<DecisionResult> => {
        try {
          return (await handle.result()) as DecisionResult;
        } catch (err) {
          // The server's answer is a failure (a run stopped in Temporal by an operator, timed out,
          // or a server that did not answer) while an attempt decides here: that attempt still
          // decides and bills, so its answer is the client's, rather than an error that invites a
          // retry charged twice.
          if (this.deciding.has(generationId)) return viaWorker();
          throw err;
        }
      };
      const viaWorker = async (): Promise<DecisionResult> => {
        const s = await next;
        if (s.ok) return s.result;
        next = this.awaitAttempt(generationId);
        return viaServer();
      };
      const fallback = new Promise<DecisionResult>((resolve, reject) => {
        timer = setTimeout(() => viaServer().then(resolve, reject), this.fallbackMs);
      });
      return await Promise.race([viaWorker(), fallback]);
    } catch (err) {
      // The client is answered with an error: an attempt this process's worker would still make
      // (a retry of the run's local activity, which learns of a stop only later) would call the
      // provider and bill a decision nobody receives. Set in the same turn as the check above.
      this.refused.set(generationId, true);
      throw err;
    } finally {
      clearTimeout(timer);
      this.waiting.delete(generationId);
    }
  }

  /**
   * The worker's side: one attempt of a decision's activity in this process. Its result goes to the
   * handler waiting here, if any; a failed attempt sends that handler to the server, which has the
   * run's outcome after its retries. An attempt for a decision whose client was answered with an
   * error here does not run.
   */
  async decide(generationId: string, attempt: () => Promise<DecisionResult>): Promise<DecisionResult> {
    if (this.refused.peek(generationId)) {
      throw ApplicationFailure.nonRetryable('The decision was already answered with an error; it is not tried again', 'DecisionAbandoned');
    }
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

  /** The next attempt's outcome, as `decide` reports it. */
  private awaitAttempt(generationId: string): Promise<Settlement> {
    return new Promise<Settlement>((resolve) => this.waiting.set(generationId, resolve));
  }

  /** Callers still waiting; zero whenever no decision is in flight. */
  get pending(): number {
    return this.waiting.size;
  }
}
