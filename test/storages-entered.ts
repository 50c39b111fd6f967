// Which AsyncLocalStorages are entered while some work runs: the first one entered turns on Node's
// promise hooks for the rest of the process (infrastructure/temporal/sync-scope.ts).
import { AsyncLocalStorage } from 'node:async_hooks';

/** The AsyncLocalStorage methods (`run`, `enterWith`) called while `work` ran, in order. */
export async function storagesEntered(work: () => Promise<unknown>): Promise<string[]> {
  const entered: string[] = [];
  const { run, enterWith } = AsyncLocalStorage.prototype;
  AsyncLocalStorage.prototype.run = function (this: AsyncLocalStorage<unknown>, ...args: Parameters<typeof run>) {
    entered.push('run');
    return run.apply(this, args);
  } as typeof run;
  AsyncLocalStorage.prototype.enterWith = function (this: AsyncLocalStorage<unknown>, ...args: Parameters<typeof enterWith>) {
    entered.push('enterWith');
    return enterWith.apply(this, args);
  } as typeof enterWith;
  try {
    await work();
  } finally {
    Object.assign(AsyncLocalStorage.prototype, { run, enterWith });
  }
  return entered;
}
