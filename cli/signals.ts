// How a long-running command ends: on SIGINT or SIGTERM, each part it started is stopped in turn.
import type { Logger } from '../log';

export type Stop = () => Promise<void>;

/** Runs until SIGINT or SIGTERM, then calls every stop function, newest first. */
export function stopOnSignals(logger: Logger, stops: Stop[]): void {
  let stopping = false;
  const handler = (signal: NodeJS.Signals) => {
    if (stopping) return;
    stopping = true;
    logger.info({ signal }, 'shutting down');
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
