// Memory held by request bodies while they arrive, per process. A body is kept in memory until it
// has arrived in full (up to BODY_LIMIT, 10 MB by default), and its client decides how long that
// takes: a thousand slow 10 MB bodies of one workspace would hold 10 GB, and the process would be
// killed for it with every other workspace's calls. So bodies in memory hold at most
// BODIES × BODY_LIMIT at once (640 MB by default), one workspace's at most three quarters of that
// (`ownerShare`, as for provider slots and batch bodies on disk).
import { RateLimitedError } from '../infrastructure/errors';
import { SharedBytes } from '../infrastructure/concurrency/shared-bytes';
import { sizeText } from '../infrastructure/errors/sizes';

/** Bodies of the largest size the process may hold in memory at once. */
const BODIES = 64;

export class BodyMemory extends SharedBytes {
  constructor(bodyLimitBytes: number) {
    super(BODIES * bodyLimitBytes, {
      owner: (_, share) =>
        new RateLimitedError(
          `This workspace is sending more request bodies to this process at once than it may hold (${sizeText(share)}); retry once they are read`,
          1,
        ),
      all: () => new RateLimitedError('This process is receiving too many request bodies at once; retry shortly', 1),
    });
  }
}
