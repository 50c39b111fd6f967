// Keeps the embedded stack's processes running: one that exits unexpectedly is started again, on
// the same port and data, after a backoff; one that crashes `maxCrashes` times within `windowMs`
// is given up on (the caller stops everything and exits non-zero, rather than loop for ever).
import type { Logger } from '../infrastructure/log';
import type { ManagedProcess } from './processes';

export type PartState = 'ok' | 'restarting';

/** Exits within CRASH_WINDOW_MS that make a part one to give up on. */
const MAX_CRASHES = 5;
const CRASH_WINDOW_MS = 60_000;
/** First restart delay; doubles with each exit in the window, up to 10 s. */
const FIRST_BACKOFF_MS = 500;

interface Part {
  start: () => Promise<ManagedProcess>;
  state: PartState;
  current: ManagedProcess;
  crashes: number[];
  /** A restart under way (backoff or start), which `stop()` waits for. */
  restarting: Promise<void> | null;
}

export class Supervisor {
  private readonly parts = new Map<string, Part>();
  private stopping = false;

  constructor(
    private readonly logger: Logger,
    private readonly giveUp: (part: string, message: string) => void,
  ) {}

  /** Starts a part (resolving once it is ready) and keeps it running. */
  async keep(name: string, start: () => Promise<ManagedProcess>): Promise<void> {
    const part: Part = { start, state: 'ok', current: await start(), crashes: [], restarting: null };
    this.parts.set(name, part);
    this.watch(name, part);
  }

  private watch(name: string, part: Part): void {
    void part.current.done.then(() => {
      if (this.stopping) return;
      part.restarting = this.restart(name, part).finally(() => (part.restarting = null));
    });
  }

  private async restart(name: string, part: Part): Promise<void> {
    part.state = 'restarting';
    // Each pass is one exit: the part's, then each start that failed; none once the gateway stops.
    while (!this.stopping) {
      const now = Date.now();
      part.crashes = [...part.crashes.filter((t) => now - t < CRASH_WINDOW_MS), now];
      const status = part.current.exitStatus;
      this.logger.warn(
        { part: name, exit_code: status?.code ?? null, signal: status?.signal ?? null, crashes_last_minute: part.crashes.length },
        'embedded process exited; restarting it',
      );
      if (part.crashes.length >= MAX_CRASHES) {
        this.giveUp(
          name,
          `${name} exited ${part.crashes.length} times within ${Math.round(CRASH_WINDOW_MS / 1000)} s (last: ${status?.signal ?? `code ${status?.code}`}); giving up. Its last output:\n${part.current.recentOutput()}`,
        );
        return;
      }
      await new Promise((r) => setTimeout(r, Math.min(FIRST_BACKOFF_MS * 2 ** (part.crashes.length - 1), 10_000)));
      if (this.stopping) return;
      try {
        part.current = await part.start();
        // Stopped while it was starting: `stop()` is waiting for this restart to end.
        if (this.stopping) return void (await part.current.stop());
        part.state = 'ok';
        this.logger.info({ part: name }, 'embedded process is back');
        this.watch(name, part);
        return;
      } catch (err) {
        // It could not even start: that counts as another crash.
        this.logger.error({ part: name, err: (err as Error).message.slice(0, 500) }, 'embedded process did not start again');
      }
    }
  }

  /** Each part's state, for /readyz. */
  status(): Record<string, PartState> {
    return Object.fromEntries([...this.parts].map(([name, p]) => [name, p.state]));
  }

  /**
   * No restarts from here on: the gateway is shutting down. A database that dies now is not started
   * again for the API processes' last writes: those fail at once on its closed port (measured), and
   * leave what a crashed process leaves (usage records wait in the journal for the next start).
   */
  halt(): void {
    this.stopping = true;
  }

  /** Stops every part, a part being restarted included (no restarts from here on). */
  async stop(): Promise<void> {
    this.stopping = true;
    await Promise.all([...this.parts.values()].map((p) => Promise.all([p.current.stop(), p.restarting])));
  }
}
