// A running batch's counts, as readers (GET, list, cancel) show them. They are the sum of the
// chunks' progress documents, but reading every chunk's on every poll made one client polling a
// 50,000-line batch cost the database half a core (FerretDB spends ~0.4–1.3 ms of CPU on any read
// by `_id`, and such a batch has 200 chunks). Two facts keep a poll to a few reads:
// - a chunk whose progress counts all its lines is finished and never changes again, so each
//   process remembers finished chunks' counts;
// - a chunk stores its progress document (empty) when it starts, and chunks start in order, so the
//   first chunk without one ends the reading: none after it has started either. A chunk started
//   out of order (two dispatched together) is counted from the next poll on; counts never go back.
import type { Store } from '../../infrastructure/store';
import { chunkLines, readProgress, type BatchDoc } from './store';

type Counts = { completed: number; failed: number };

export class LiveCounts {
  /** Finished chunks' counts by batch, the most recently read batch last (least recent dropped first). */
  private readonly finished = new Map<string, Map<number, Counts>>();

  constructor(
    private readonly store: Store,
    private readonly maxBatches = 1_000,
  ) {}

  async of(b: BatchDoc): Promise<Counts> {
    if (b.final_counts) {
      this.finished.delete(b._id);
      return b.final_counts;
    }
    const known = this.finished.get(b._id) ?? new Map<number, Counts>();
    this.finished.delete(b._id);
    const total = { completed: 0, failed: 0 };
    let reading = true;
    for (let c = 0; c < b.chunks; c++) {
      let counts = known.get(c);
      if (!counts && reading) {
        const saved = await readProgress(this.store, b, c);
        if (!saved) reading = false;
        else {
          counts = { completed: saved.completed, failed: saved.failed };
          if (counts.completed + counts.failed >= chunkLines(b, c)) known.set(c, counts);
        }
      }
      if (!counts) continue;
      total.completed += counts.completed;
      total.failed += counts.failed;
    }
    this.finished.set(b._id, known);
    if (this.finished.size > this.maxBatches) this.finished.delete(this.finished.keys().next().value!);
    return total;
  }
}
