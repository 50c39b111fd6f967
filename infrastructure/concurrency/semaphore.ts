// A counting semaphore with a queue. A released slot passes straight to a waiter, so a caller
// arriving meanwhile cannot take it too and push the count past `max`. Slots may be held on behalf
// of owners (workspaces): a released slot goes to the waiting owner that holds the fewest (the
// longest waiter among equals), so one owner's queue cannot keep another waiting behind it. A
// `capped` slot (one whose holder decides how long it lasts) is taken only while its owner holds
// fewer than `maxPerOwner`: what one owner leaves is the others', however long it holds its own.

/** An owner's share of `max` slots: all but a quarter (rounded down), so the other owners always keep that quarter. */
export const ownerShare = (max: number): number => max - Math.floor(max / 4);

interface Waiter {
  owner: string | null;
  capped: boolean;
  /** Arrival order, across owners. */
  seq: number;
  wake: () => void;
  fail: (err: Error) => void;
}

export interface AcquireOptions {
  /** Who the slot is for; unowned slots count only against `max`. */
  owner?: string;
  /**
   * Taken only within the owner's share: for slots the others must not wait behind, such as a
   * stream held for as long as its client reads, or a decision workflow whose start is waited for.
   */
  capped?: boolean;
  waitMs?: number;
  signal?: AbortSignal;
  /** The error for a wait that ran out; `capped` when the owner's own share was what it waited for. */
  onTimeout?: (capped: boolean) => Error;
  onAbort?: () => Error;
}

export class Semaphore {
  private active = 0;
  /**
   * Waiters by owner, each owner's in arrival order; an owner is here while it has any. By owner,
   * so that a release looks at the few owners waiting, not at every waiter (a batch keeps a few
   * hundred lines waiting on a provider's slots, and a slot is freed thousands of times a second).
   */
  private readonly waiting = new Map<string | null, Waiter[]>();
  private arrivals = 0;
  /** Slots held per owner, for the owners holding any. */
  private readonly held = new Map<string, number>();

  constructor(
    readonly max: number,
    readonly maxPerOwner = max,
  ) {}

  private heldBy(owner: string | null): number {
    return owner === null ? 0 : (this.held.get(owner) ?? 0);
  }

  private mayTake(owner: string | null, capped: boolean): boolean {
    return !capped || this.heldBy(owner) < this.maxPerOwner;
  }

  /** The waiter a freed slot goes to: of those that may take it, the one whose owner holds the fewest, the longest waiting among equals. */
  private nextWaiter(): Waiter | undefined {
    let best: Waiter | undefined;
    let bestHeld = Infinity;
    for (const [owner, queue] of this.waiting) {
      const held = this.heldBy(owner);
      if (held > bestHeld) continue;
      // Within its share every waiter of the owner may take a slot; past it, only uncapped ones.
      const w = held < this.maxPerOwner ? queue[0] : queue.find((x) => !x.capped);
      if (w && (held < bestHeld || w.seq < best!.seq)) {
        best = w;
        bestHeld = held;
      }
    }
    return best;
  }

  /**
   * Resolves with a release function once a slot is held. Rejects with `onTimeout()` after
   * `waitMs`, or with `onAbort()` when `signal` fires, if no slot came by then.
   */
  acquire(opts: AcquireOptions = {}): Promise<() => void> {
    const owner = opts.owner ?? null;
    const capped = opts.capped === true;
    if (this.active < this.max && this.mayTake(owner, capped)) {
      this.active++;
      return Promise.resolve(this.releaser(owner));
    }
    if (opts.signal?.aborted) return Promise.reject(opts.onAbort?.() ?? new Error('aborted'));
    return new Promise((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const entry: Waiter = {
        owner,
        capped,
        seq: this.arrivals++,
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
        const queue = this.waiting.get(owner);
        const i = queue ? queue.indexOf(entry) : -1;
        if (i < 0) return;
        queue!.splice(i, 1);
        if (!queue!.length) this.waiting.delete(owner);
      };
      if (opts.waitMs !== undefined)
        timer = setTimeout(() => entry.fail(opts.onTimeout?.(!this.mayTake(owner, capped)) ?? new Error('timed out')), opts.waitMs);
      opts.signal?.addEventListener('abort', onAbort, { once: true });
      const queue = this.waiting.get(owner);
      if (queue) queue.push(entry);
      else this.waiting.set(owner, [entry]);
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
      const next = this.nextWaiter();
      // The slot moves to the waiter as it is: `active` stays, and nobody can slip in between.
      if (next) next.wake();
      else this.active--;
    };
  }
}
