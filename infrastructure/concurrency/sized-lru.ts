// Values kept in a process's memory up to a budget of their own measure (characters, entries), the
// least recently read leaving first. For what never changes once written (result pages, preset
// versions) or is checked before use (a workspace's preset order), so a kept value is right.

export class SizedLru<V> {
  /** Least recently read first: a Map iterates in insertion order. */
  private readonly items = new Map<string, { value: V; size: number }>();
  private size = 0;

  /** A value of more than `maxItem` (an eighth of the budget unless told) is not kept: it would push out many others. */
  constructor(
    readonly budget: number,
    private readonly maxItem = budget / 8,
  ) {}

  /** A kept value, now the most recently read. */
  get(key: string): V | undefined {
    const e = this.items.get(key);
    if (!e) return undefined;
    this.items.delete(key);
    this.items.set(key, e);
    return e.value;
  }

  /** Keeps (or replaces) a value, dropping the least recently read past the budget. */
  set(key: string, value: V, size: number): void {
    this.delete(key);
    if (size > this.maxItem) return;
    this.items.set(key, { value, size });
    this.size += size;
    for (const [k, e] of this.items) {
      if (this.size <= this.budget) break;
      this.items.delete(k);
      this.size -= e.size;
    }
  }

  delete(key: string): void {
    const e = this.items.get(key);
    if (!e) return;
    this.items.delete(key);
    this.size -= e.size;
  }

  get held(): number {
    return this.size;
  }
}
