// A chunk's finished lines on their way to the database: results, then usage records (through the
// one ledger writer), then the chunk's progress document, one unordered write each per group.
// Lines count as done only once written, so a retried chunk redoes at most the unwritten ones; the
// first stored result of a line wins, and its usage is what is billed. A write that fails (the
// database is down) keeps its results for the next one rather than losing paid work; only when
// writes keep failing for `outageMs` does the writer give up.
import { usageRecordOf, type UsageLedger, type UsageRecord } from '../accounts/usage-ledger';
import type { Store } from '../../infrastructure/store';
import { addToTally, emptyTally, pickTally, saveProgress, type ChunkTally, type ProgressDoc } from './progress';
import { writeResultsOnce, type ResultDoc } from './results';
import { type BatchDoc } from './store';

/** The usage record of one billed line (its `_id` is the line's generation id). */
export function lineUsage(b: BatchDoc, r: ResultDoc): UsageRecord {
  return usageRecordOf(
    { generationId: r.id, workspaceId: b.workspace_id, keyId: b.key_id, kind: 'batch_line', meta: b.meta, batchId: b._id },
    { model: b.canonical_model, provider: r.provider, usage: r.usage!, cost: r.usage!.cost },
  );
}

export class ChunkWriter {
  /** Lines whose results are stored, and the counts of them: where a retry resumes. */
  readonly done: Set<number>;
  readonly tally: ChunkTally;
  private readonly pending: ResultDoc[] = [];
  /** What is stored for each line this run wrote (the first write of a line wins): the chunk's pages. */
  private readonly stored = new Map<number, ResultDoc>();
  /** Billed lines whose usage records are not stored yet: told once they are (spend admission). */
  private readonly unstored = new Map<number, () => void>();
  private failingSince: number | null = null;
  private lastError: unknown = null;
  private writing: Promise<void> = Promise.resolve();

  constructor(
    private readonly o: { store: Store; usage: UsageLedger; batch: BatchDoc; chunkIndex: number; outageMs: number },
    saved: ProgressDoc | null,
  ) {
    this.done = new Set(saved?.done ?? []);
    this.tally = { ...emptyTally(), ...(saved ? pickTally(saved) : {}) };
  }

  add(r: ResultDoc, stored?: () => void): void {
    this.pending.push(r);
    if (stored) this.unstored.set(r.line, stored);
  }

  /** The chunk is over: lines whose records were never stored were not billed either. */
  forgetUnstored(): void {
    for (const stored of this.unstored.values()) stored();
    this.unstored.clear();
  }

  /** What is stored for a line this run wrote, if it did. */
  storedResult(line: number): ResultDoc | undefined {
    return this.stored.get(line);
  }

  get backlog(): number {
    return this.pending.length;
  }

  get failing(): boolean {
    return this.failingSince !== null;
  }

  /** Writes have failed for longer than the outage allowance. */
  get gaveUp(): boolean {
    return this.failingSince !== null && Date.now() - this.failingSince > this.o.outageMs;
  }

  get error(): unknown {
    return this.lastError;
  }

  /** Writes what is pending, after any write in flight. Never rejects: a failure keeps the results pending. */
  flush(): Promise<void> {
    this.writing = this.writing.then(() => this.writeOnce());
    return this.writing;
  }

  private async writeOnce(): Promise<void> {
    if (!this.pending.length) return;
    const group = this.pending.splice(0);
    const { store, usage, batch, chunkIndex } = this.o;
    try {
      const stored = await writeResultsOnce(store, batch, group);
      await Promise.all(stored.filter((r) => r.ok && r.usage).map((r) => usage.recordStored(lineUsage(batch, r))));
      for (const r of group) {
        this.unstored.get(r.line)?.();
        this.unstored.delete(r.line);
      }
      for (const r of stored) {
        this.stored.set(r.line, r);
        // Already counted when this group was written before and a later step (the progress
        // write) failed: the group comes back whole, its lines must not count twice.
        if (this.done.has(r.line)) continue;
        addToTally(this.tally, r);
        this.done.add(r.line);
      }
      await saveProgress(store, batch, chunkIndex, this.tally, [...this.done]);
      this.failingSince = null;
    } catch (err) {
      // Every step is idempotent, so writing the whole group again is safe.
      this.pending.unshift(...group);
      this.failingSince ??= Date.now();
      this.lastError = err;
    }
  }
}
