// Bytes held out of a budget on behalf of owners (workspaces), each at most its `ownerShare`: what
// one owner holds for as long as its clients decide (bodies arriving slowly), the others can never
// need all of. The byte counterpart of the semaphore's capped slots; it refuses rather than queues,
// since what waits here is a client's upload.
import { ownerShare } from './semaphore';

export class SharedBytes {
  readonly share: number;
  private held = 0;
  private readonly heldBy = new Map<string, number>();

  constructor(
    readonly budget: number,
    private readonly refuse: {
      /** The owner would hold more than its share (`held` now). */
      owner: (held: number, share: number) => Error;
      /** The budget would be exceeded. */
      all: () => Error;
    },
  ) {
    this.share = ownerShare(budget);
  }

  /** Bytes held now, over all owners. */
  get heldBytes(): number {
    return this.held;
  }

  /** Counts `bytes` more for an owner, or throws the refusal, counting nothing. */
  add(owner: string, bytes: number): void {
    const mine = this.heldBy.get(owner) ?? 0;
    if (mine + bytes > this.share) throw this.refuse.owner(mine, this.share);
    if (this.held + bytes > this.budget) throw this.refuse.all();
    this.held += bytes;
    this.heldBy.set(owner, mine + bytes);
  }

  /** Gives back what `add` counted. */
  release(owner: string, bytes: number): void {
    if (!bytes) return;
    this.held -= bytes;
    const left = this.heldBy.get(owner)! - bytes;
    if (left) this.heldBy.set(owner, left);
    else this.heldBy.delete(owner);
  }
}
