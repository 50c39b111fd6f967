// A counting semaphore with a FIFO queue. A released slot passes straight to the longest waiter
// that may take it, so a caller arriving meanwhile cannot take it too and push the count past `max`.
// Slots may be held on behalf of owners (workspaces), none of which may hold more than
// `maxPerOwner` at once: what one owner leaves is the others' to take, however long it holds its own.

/** An owner's share of `max` slots: all but a quarter (rounded down), so the other owners always keep that quarter. */
export const ownerShare = (max: number): number => max - Math.floor(max / 4);

interface Waiter {
  owner: string | null;
  wake: () => void;
  fail: (err: Error) => void;
}

export interface AcquireOptions {
  /** Who the slot is for; unowned slots count only against `max`. */
  owner?: string;
  waitMs?: number;
  signal?: AbortSignal;
  /** The error for a wait that ran out; `capped` when the owner's own share was what it waited for. */
  onTimeout?: (capped: boolean) => Error;
  onAbort?: () => Error;
}

export class Semaphore {
  private active = 0;
  private readonly waiting: Waiter[] = [];
  /** Slots held per owner, for the owners holding any. */
  private readonly held = new Map<string, number>();

  constructor(
    readonly max: number,
    readonly maxPerOwner = max,
  ) {}

  private mayTake(owner: string | null): boolean {
    return owner === null || (this.held.get(owner) ?? 0) < this.maxPerOwner;
  }

  /**
   * Resolves with a release function once a slot is held. Rejects with `onTimeout()` after
   * `waitMs`, or with `onAbort()` when `signal` fires, if no slot came by then.
   */
  acquire(opts: AcquireOptions = {}): Promise<() => void> {
    const owner = opts.owner ?? null;
    if (this.active < this.max && this.mayTake(owner)) {
      this.active++;
      return Promise.resolve(this.releaser(owner));
    }
    if (opts.signal?.aborted) return Promise.reject(opts.onAbort?.() ?? new Error('aborted'));
    return new Promise((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const entry: Waiter = {
        owner,
        wake: () => {
          cleanup();
          resolve(this.releaser(owner));
        },
        fail: (err: Error) => {
          cleanup();
          reject(err);
        },
      };
      const onAbort = () => entry.fail(opts.onAbort?.() ?? new Error('aborted'));
      const cleanup = () => {
        clearTimeout(timer);
        opts.signal?.removeEventListener('abort', onAbort);
        const i = this.waiting.indexOf(entry);
        if (i >= 0) this.waiting.splice(i, 1);
      };
      if (opts.waitMs !== undefined)
        timer = setTimeout(() => entry.fail(opts.onTimeout?.(!this.mayTake(owner)) ?? new Error('timed out')), opts.waitMs);
      opts.signal?.addEventListener('abort', onAbort, { once: true });
      this.waiting.push(entry);
    });
  }

  /** Counts a slot as the owner's; the function returned gives it back. */
  private releaser(owner: string | null): () => void {
    if (owner !== null) this.held.set(owner, (this.held.get(owner) ?? 0) + 1);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      if (owner !== null) {
        const n = this.held.get(owner)! - 1;
        if (n) this.held.set(owner, n);
        else this.held.delete(owner);
      }
      const next = this.waiting.find((w) => this.mayTake(w.owner));
      // The slot moves to the waiter as it is: `active` stays, and nobody can slip in between.
      if (next) next.wake();
      else this.active--;
    };
  }
}
