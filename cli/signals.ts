// How a long-running command ends: on SIGINT or SIGTERM, each part it started is stopped in turn.
import type { Logger } from '../infrastructure/log';

export type Stop = () => Promise<void>;

/** How long a shutdown may take at most: every part's own grace, and some. */
export function shutdownDeadlineMs(shutdownGraceMs: number): number {
  return 3 * shutdownGraceMs + 30_000;
}

/**
 * Runs until SIGINT or SIGTERM, then calls every stop function, newest first. `first` runs at once,
 * before any of them: what must not happen during the shutdown (restarting a child that exits while
 * the gateway is stopping) is ended there. A shutdown still running
 * after `deadlineMs` (a database that accepts connections and never answers holds a stop forever)
 * ends with exit code 1; the watchdogs stop the children.
 */
export function stopOnSignals(logger: Logger, stops: Stop[], opts: { deadlineMs: number; first?: () => void }): void {
  let stopping = false;
  const handler = (signal: NodeJS.Signals) => {
    if (stopping) return;
    stopping = true;
    opts.first?.();
    logger.info({ signal }, 'shutting down');
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
      process.exit(0);
    })();
  };
  process.on('SIGINT', handler);
  process.on('SIGTERM', handler);
}
