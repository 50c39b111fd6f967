// A process's start waits on other services (MongoDB, Temporal); one that does not answer would
// otherwise leave the process silent and not listening, with nothing in its log to say why.
import type { Logger } from '../infrastructure/log';

/** How often a step still unfinished is reported. */
const REPORT_EVERY_MS = 10_000;

/** Awaits `step`, logging a warning naming it every `everyMs` until it settles. */
export async function startupStep<T>(logger: Logger, what: string, step: Promise<T>, everyMs = REPORT_EVERY_MS): Promise<T> {
  const started = Date.now();
  const timer = setInterval(() => logger.warn({ step: what, waited_ms: Date.now() - started }, `start-up still waiting: ${what}`), everyMs);
  try {
    return await step;
  } finally {
    clearInterval(timer);
  }
}
