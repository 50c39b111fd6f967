// Running batches' counts, as readers (GET, list, cancel) show them. They are the sum of the chunks'
// progress documents, but reading every chunk's on every poll made one client polling a
// 50,000-line batch cost the database half a core (FerretDB spends ~0.4–1.3 ms of CPU on any read,
// and such a batch has 200 chunks), and a list of 100 running batches read one document after
// another, ~2 per batch: 100 ms of FerretDB's CPU and 50 ms of the API process's per list. So:
// - a chunk whose progress counts all its lines is finished and never changes again, so each
//   process remembers finished chunks' counts;
// - a chunk stores its progress document (empty) when it starts, and chunks start in order, so the
//   first chunk without one ends the reading: none after it has started either. A chunk started
//   out of order (two dispatched together) is counted from the next poll on; counts never go back;
// - the chunks still to read, of every batch asked about, are read together: the next READ_AHEAD
//   of each batch in one read of an `_id` set, and again only for batches whose every chunk asked
//   for had started. FerretDB spends ~0.15 ms per document it finds and next to nothing per id it
//   does not (200 in 1.5 ms), so asking for chunks that have not started costs little, and a
//   running batch has at most BATCH_WINDOW (4) chunks unfinished: a poll is one read, whatever the
//   number of batches.
import type { Store } from '../../infrastructure/store';
import { chunkLines } from './results';
import { progressCounts, type ChunkRef } from './progress';
import { type BatchDoc } from './store';

type Counts = { completed: number; failed: number };

/** Chunks of one batch asked for in one read: more than a batch runs at once, plus the first not started. */
const READ_AHEAD = 8;

export class LiveCounts {
  /** Finished chunks' counts by batch, the most recently read batch last (least recent dropped first). */
  private readonly finished = new Map<string, Map<number, Counts>>();

  constructor(
    private readonly store: Store,
    private readonly maxBatches = 1_000,
  ) {}

  async of(b: BatchDoc): Promise<Counts> {
    return (await this.ofEach([b]))[0];
  }

  /** The counts of each batch, in order. */
  async ofEach(bs: BatchDoc[]): Promise<Counts[]> {
    const running = bs
      .filter((b) => !b.final_counts)
      .map((b) => {
        const known = this.finished.get(b._id) ?? new Map<number, Counts>();
        return { b, known, unfinished: [] as Counts[], next: 0, reading: true };
      });
    for (;;) {
      const asked: (ChunkRef & { run: (typeof running)[number] })[] = [];
      for (const run of running) {
        let n = 0;
        for (let c = run.next; run.reading && c < run.b.chunks && n < READ_AHEAD; c++) {
          if (run.known.has(c)) continue;
          asked.push({ b: run.b, chunkIndex: c, run });
          n++;
        }
        if (!n) run.reading = false;
      }
      if (!asked.length) break;
      const found = await progressCounts(this.store, asked);
      asked.forEach(({ chunkIndex: c, run }, i) => {
        if (!run.reading) return;
        const counts = found[i];
        if (!counts) return void (run.reading = false);
        run.next = c + 1;
        if (counts.completed + counts.failed >= chunkLines(run.b, c)) run.known.set(c, counts);
        else run.unfinished.push(counts);
      });
    }
    const totals = new Map<string, Counts>();
    for (const { b, known, unfinished } of running) {
      const total = { completed: 0, failed: 0 };
      for (const counts of [...known.values(), ...unfinished]) {
        total.completed += counts.completed;
        total.failed += counts.failed;
      }
      totals.set(b._id, total);
      this.remember(b._id, known);
    }
    return bs.map((b) => {
      if (b.final_counts) {
        this.finished.delete(b._id);
        return b.final_counts;
      }
      return totals.get(b._id)!;
    });
  }

  private remember(batchId: string, known: Map<number, Counts>) {
    this.finished.delete(batchId);
    this.finished.set(batchId, known);
    if (this.finished.size > this.maxBatches) this.finished.delete(this.finished.keys().next().value!);
  }
}
