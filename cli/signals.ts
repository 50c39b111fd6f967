// How a long-running command ends: on SIGINT or SIGTERM, each part it started is stopped in turn.
import type { Logger } from '../infrastructure/log';

export type Stop = () => Promise<void>;

/** How long a shutdown may take at most: every part's own grace, and some. */
export function shutdownDeadlineMs(shutdownGraceMs: number): number {
  return 3 * shutdownGraceMs + 30_000;
}

/**
 * Runs until SIGINT or SIGTERM, then calls `first` at once (what must not happen during the
 * shutdown is ended there: restarting a child that exits), then every stop function, newest first,
 * and exits 0. The function it returns starts the same shutdown from within (a part that keeps
 * crashing) and exits 1; called during a shutdown, it only makes the exit code 1, so nothing is
 * stopped twice. A shutdown still running after `deadlineMs` (a database that accepts connections
 * and never answers holds a stop forever) ends with exit code 1; the watchdogs stop the children.
 */
export function stopOnSignals(logger: Logger, stops: Stop[], opts: { deadlineMs: number; first?: () => void }): (exitCode: number) => void {
  let stopping = false;
  let exitCode = 0;
  const shutdown = (code: number) => {
    exitCode = Math.max(exitCode, code);
    if (stopping) return;
    stopping = true;
    opts.first?.();
    setTimeout(() => {
      logger.error({ deadline_ms: opts.deadlineMs }, 'shutdown did not finish in time; exiting');
      process.exit(1);
    }, opts.deadlineMs).unref();
    void (async () => {
      for (const stop of [...stops].reverse()) {
        try {
          await stop();
        } catch (err) {
          logger.error({ err }, 'error while stopping');
        }
      }
      process.exit(exitCode);
    })();
  };
  const onSignal = (signal: NodeJS.Signals) => {
    if (!stopping) logger.info({ signal }, 'shutting down');
    shutdown(0);
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  return shutdown;
}
