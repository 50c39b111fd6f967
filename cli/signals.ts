// How a long-running command ends: on SIGINT or SIGTERM, each part it started is stopped in turn.
import type { Logger } from '../infrastructure/log';

export type Stop = () => Promise<void>;

/**
 * Runs until SIGINT or SIGTERM, then calls every stop function, newest first. `first` runs at once,
 * before any of them: what must not happen during the shutdown (restarting a child the same signal
 * stopped, as a signal to the whole process group does) is ended there.
 */
export function stopOnSignals(logger: Logger, stops: Stop[], first?: () => void): void {
  let stopping = false;
  const handler = (signal: NodeJS.Signals) => {
    if (stopping) return;
    stopping = true;
    first?.();
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
