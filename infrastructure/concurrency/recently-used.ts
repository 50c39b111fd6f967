// Per-key state a process keeps in memory for the keys in use (workspaces, mostly), dropped once
// idle. A process that kept every workspace it ever served grew without bound: 1.2 KB a workspace
// across its balance view, usage totals and trace destinations (20,000 more workspaces: +24 MB of heap).
//
// No timer and no sweep over the whole map: each key added looks at the two entries held longest
// (a Map iterates in insertion order). One unused for `idleMs` that its owner lets go is dropped;
// any other is moved to the back. So the map holds about the keys used within `idleMs`, the keys
// their owner must keep, and the keys added since, at a constant cost per key added.

/** How long an entry is kept unused, unless told: long next to the caches' periods (seconds), short next to a process's life. */
const DEFAULT_IDLE_MS = 600_000;

export interface RecentlyUsedOptions<V> {
  idleMs?: number;
  /** False keeps an idle entry (work still in flight for it). */
  canDrop?: (value: V, key: string) => boolean;
  /** Told of each entry dropped for idleness (not of `delete`). */
  onDrop?: (value: V, key: string) => void;
  now?: () => number;
}

/** How many of the oldest entries each new key looks at: more than one, so the map shrinks when idle keys are at its front. */
const LOOKS_PER_ADD = 2;

export class RecentlyUsed<V> {
  private readonly map = new Map<string, { value: V; usedAt: number }>();
  private readonly now: () => number;

  private readonly idleMs: number;

  constructor(private readonly o: RecentlyUsedOptions<V> = {}) {
    this.now = o.now ?? Date.now;
    this.idleMs = o.idleMs ?? DEFAULT_IDLE_MS;
  }

  /** The key's value, marked as used now. */
  get(key: string): V | undefined {
    const e = this.map.get(key);
    if (!e) return undefined;
    e.usedAt = this.now();
    return e.value;
  }

  /** The key's value, without marking it used. */
  peek(key: string): V | undefined {
    return this.map.get(key)?.value;
  }

  set(key: string, value: V): void {
    const e = this.map.get(key);
    if (e) {
      e.value = value;
      e.usedAt = this.now();
      return;
    }
    this.dropIdle();
    this.map.set(key, { value, usedAt: this.now() });
  }

  delete(key: string): boolean {
    return this.map.delete(key);
  }

  get size(): number {
    return this.map.size;
  }

  *values(): IterableIterator<V> {
    for (const e of this.map.values()) yield e.value;
  }

  private dropIdle(): void {
    const idleSince = this.now() - this.idleMs;
    for (let i = 0; i < LOOKS_PER_ADD && this.map.size; i++) {
      const [key, e] = this.map.entries().next().value as [string, { value: V; usedAt: number }];
      this.map.delete(key);
      if (e.usedAt <= idleSince && (this.o.canDrop?.(e.value, key) ?? true)) {
        this.o.onDrop?.(e.value, key);
        continue;
      }
      this.map.set(key, e); // kept: to the back
    }
  }
}
