// Documents of settled batches kept in a process's memory for listing, the least recently listed
// leaving first. A page of 100 batches cost FerretDB ~27 ms of CPU to read their documents (and the
// API process ~5 ms to decode them), on every list: a client listing in a loop took half of another
// workspace's chat throughput. A settled batch's document never changes again, so a kept one is
// right; a deleted one is not listed, because a deletion removes the batch's list entries before
// its document (store.ts deleteBatch), and a list reads the entries from the store every time.
import { SizedLru } from '../../infrastructure/concurrency/sized-lru';
import { TERMINAL_STATUSES } from './schema';
import type { BatchDoc } from './store';

/** Batch documents kept per process: ~3 KB each in memory, ~30 MB in all. */
const SETTLED_BATCHES = 10_000;

const terminal = new Set<string>(TERMINAL_STATUSES);

/** Closed, and its webhook (if any) done with: nothing writes its document again but a deletion. */
export function isSettled(b: BatchDoc): boolean {
  return terminal.has(b.status) && (!b.callback_url || !!b.webhook);
}

export class SettledBatches {
  private readonly docs: SizedLru<BatchDoc>;

  constructor(count = SETTLED_BATCHES) {
    this.docs = new SizedLru(count, 1);
  }

  /** A kept document, now the most recently listed. */
  get(id: string): BatchDoc | undefined {
    return this.docs.get(id);
  }

  /** Keeps a document read from the store, if its batch is settled. */
  keep(b: BatchDoc): void {
    if (isSettled(b)) this.docs.set(b._id, b, 1);
  }

  get held(): number {
    return this.docs.held;
  }
}
