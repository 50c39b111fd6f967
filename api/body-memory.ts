// Memory held by request bodies while they arrive, per process. A body is kept in memory until it
// has arrived in full (up to BODY_LIMIT, 10 MB by default), and its client decides how long that
// takes: a thousand slow 10 MB bodies of one workspace would hold 10 GB, and the process would be
// killed for it with every other workspace's calls. So bodies in memory hold at most
// BODIES × BODY_LIMIT at once (640 MB by default), one workspace's at most three quarters of that
// (`ownerShare`, as for provider slots and batch bodies on disk).
import { RateLimitedError } from '../infrastructure/errors';
import { ownerShare } from '../infrastructure/concurrency/semaphore';

/** Bodies of the largest size the process may hold in memory at once. */
const BODIES = 64;

const mb = (bytes: number) => `${Math.round(bytes / 1024 ** 2)} MB`;

export class BodyMemory {
  readonly budget: number;
  private held = 0;
  private readonly heldBy = new Map<string, number>();

  constructor(bodyLimitBytes: number) {
    this.budget = BODIES * bodyLimitBytes;
  }

  /** Counts `bytes` more of a workspace's bodies (or refuses them, counting nothing). */
  add(workspaceId: string, bytes: number): void {
    const mine = this.heldBy.get(workspaceId) ?? 0;
    const share = ownerShare(this.budget);
    if (mine + bytes > share)
      throw new RateLimitedError(
        `This workspace is sending more request bodies to this process at once than it may hold (${mb(share)}); retry once they are read`,
        1,
      );
    if (this.held + bytes > this.budget)
      throw new RateLimitedError('This process is receiving too many request bodies at once; retry shortly', 1);
    this.held += bytes;
    this.heldBy.set(workspaceId, mine + bytes);
  }

  /** Gives back what `add` counted for a body, once it is read or refused. */
  release(workspaceId: string, bytes: number): void {
    if (!bytes) return;
    this.held -= bytes;
    const left = this.heldBy.get(workspaceId)! - bytes;
    if (left) this.heldBy.set(workspaceId, left);
    else this.heldBy.delete(workspaceId);
  }
}
