// The one writer of usage records (the debit side of the credits ledger), with group commit:
// records that arrive while a write is in flight wait and go together in the next `insertMany`,
// so under load many billed calls share one round trip, and a lone call waits for no timer.
// Each caller's promise settles only once its own record is durably written (or refused), so a
// client is never answered for a call whose bill could still be lost. A record's `_id` is its
// generation id: a retried call finds its record already there and is not debited twice.
import { randomBytes } from 'node:crypto';
import { toJsonText } from '../store/json-text';
import { insertManyEach, type Store, type UsageDoc } from '../store';

export type UsageRecord = Omit<UsageDoc, 'created_at'> & { created_at?: Date };

interface Pending {
  doc: UsageDoc;
  resolve: (recorded: boolean) => void;
  reject: (err: unknown) => void;
}

/** The most records one insert carries. */
const MAX_GROUP = 1_000;

export class UsageLedger {
  private queue: Pending[] = [];
  private writing = false;
  /** Round trips made so far, for tests and the benchmark: records ÷ writes is the grouping. */
  writes = 0;

  constructor(
    private readonly store: Store,
    /** Told of each record once it is stored (metrics: spend). */
    private readonly onRecorded: (doc: UsageDoc) => void = () => undefined,
  ) {}

  /** Resolves true once written, false when that generation was already recorded. */
  record(usage: UsageRecord): Promise<boolean> {
    return new Promise((resolve, reject) => {
      // Trace metadata is the caller's own object: stored as its JSON text.
      this.queue.push({
        doc: { ...usage, trace: usage.trace && toJsonText(usage.trace), created_at: usage.created_at ?? new Date() } as UsageDoc,
        resolve,
        reject,
      });
      if (!this.writing) {
        this.writing = true;
        // Let records finished in the same turn of the event loop join the first write.
        setImmediate(() => void this.drain());
      }
    });
  }

  private async drain(): Promise<void> {
    while (this.queue.length) {
      const group = this.queue.splice(0, MAX_GROUP);
      this.writes++;
      try {
        const outcomes = await insertManyEach(
          this.store.usage,
          group.map((p) => p.doc),
        );
        group.forEach((p, i) => {
          const o = outcomes[i];
          if (o instanceof Error) p.reject(o);
          else {
            if (o === 'inserted') this.onRecorded(p.doc);
            p.resolve(o === 'inserted');
          }
        });
      } catch (err) {
        for (const p of group) p.reject(err);
      }
    }
    this.writing = false;
  }
}

/** One generation's usage record, if it belongs to the workspace. */
export async function generationOf(store: Store, workspaceId: string, id: string): Promise<UsageDoc | null> {
  const doc = await store.usage.findOne({ _id: id });
  return doc && doc.workspace_id === workspaceId ? doc : null;
}

/** A new generation id: time-ordered, then 80 random bits. */
export function newGenerationId(prefix = 'gen-'): string {
  return `${prefix}${Date.now().toString(36)}${randomBytes(10).toString('hex')}`;
}
