// What a workspace keeps stored of what its clients send, and its quota (WORKSPACE_STORAGE_BYTES):
// batch inputs (kept until the batch is deleted; their bodies' and custom ids' bytes), preset
// versions (kept until the preset is deleted; their config's and system prompt's characters) and API keys (kept for
// good, revoked ones too; KEY_STORED_BYTES each). Within its
// rate limits one workspace could store 200 MB a batch, 60 batches a minute: the database's disk,
// which every workspace shares, full within the hour.
//
// Counted like the usage totals: each process (a writer, taken from a pool at start and put back at
// close, writer-pool.ts) keeps one document per workspace it stored or deleted for, `_id` =
// `<workspace>:<writer>`, holding what it added less what it removed; only it writes that document,
// one write at a time. A workspace's stored bytes are the sum of its writers' documents, one `_id`
// range read. Counted after the data is stored, and taken off once it is deleted: a process that
// dies in between leaves the count one batch short or long (the quota is a guard against filling
// the disk, not a bill).
import { randomBytes } from 'node:crypto';
import type { Document } from 'mongodb';
import { workspaceRange, type Store } from '../../infrastructure/store';
import { PaymentRequiredError } from '../../infrastructure/errors';
import { sizeText } from '../../infrastructure/errors/sizes';
import { RecentlyUsed } from '../../infrastructure/concurrency/recently-used';
import { takePooledWriter } from './writer-pool';

interface StoredBytesDoc extends Document {
  _id: string; // <workspace id>:<writer id>
  workspace_id: string;
  writer: string;
  /** What this writer stored for the workspace, less what it deleted (may be negative). */
  bytes: number;
  updated_at: Date;
}

interface PooledWriterDoc extends Document {
  _id: string;
  retired_at: Date;
}

const storedBytes = (store: Store) => store.db.collection<StoredBytesDoc>('stored_bytes');
const pool = (store: Store) => store.db.collection<PooledWriterDoc>('stored_bytes_writers');

/**
 * How long a workspace's total, as read, answers for it (with this process's own counts added): a
 * burst of creates from one workspace reads it once. Another process's stores within that time are
 * unseen, which bounds by how much several processes together may pass the quota.
 */
const FRESH_MS = 1_000;

export class StorageQuota {
  private id = `s${Date.now().toString(36)}${randomBytes(6).toString('hex')}`;
  private readonly started: Promise<void>;
  /** This writer's documents' values, for the workspaces written lately (else read by `_id` first). */
  private readonly mine: RecentlyUsed<number>;
  /** Workspaces' totals as last read, plus this process's counts since. */
  private readonly seen: RecentlyUsed<{ bytes: number; at: number }>;
  /** The last write per workspace: a writer's document takes one write at a time. */
  private readonly writing = new Map<string, Promise<void>>();
  /** Counts waiting for the write in progress: the next write takes them all (one write per turn). */
  private readonly queued = new Map<string, { bytes: number; written: Promise<void> }>();
  private closed = false;

  constructor(
    private readonly store: Store,
    /** What one workspace may store. */
    readonly quotaBytes: number,
    /** Told of a count that could not be written (the data is stored, or deleted, all the same). */
    private readonly onTrouble: (err: unknown, detail: { workspace_id: string; bytes: number }) => void = () => undefined,
    private readonly now: () => number = Date.now,
  ) {
    this.mine = new RecentlyUsed<number>({ canDrop: (_, ws) => !this.writing.has(ws) });
    this.seen = new RecentlyUsed({ idleMs: 10 * FRESH_MS, now });
    this.started = takePooledWriter(pool(store)).then((w) => {
      if (w) this.id = w._id;
    });
  }

  /** What the workspace stores now, over every writer (as read within FRESH_MS, with this process's counts since). */
  async stored(workspaceId: string): Promise<number> {
    const seen = this.seen.get(workspaceId);
    if (seen && this.now() - seen.at < FRESH_MS) return seen.bytes;
    const at = this.now();
    const docs = await storedBytes(this.store)
      .find({ _id: workspaceRange(workspaceId) })
      .toArray();
    const bytes = docs.reduce((sum, d) => sum + d.bytes, 0);
    this.seen.set(workspaceId, { bytes, at });
    return bytes;
  }

  /** Refuses (402) storing `adding` bytes more for the workspace when that would pass its quota. */
  async admit(workspaceId: string, adding: number): Promise<void> {
    this.check(await this.stored(workspaceId), adding);
  }

  /** Refuses (402) storing `adding` bytes more for a workspace that stores `held` when that would pass the quota. */
  check(held: number, adding: number): void {
    if (held + adding <= this.quotaBytes) return;
    throw new PaymentRequiredError(
      `This workspace stores ${sizeText(held)} of batch inputs, preset versions and keys, of the ${sizeText(this.quotaBytes)} it may store, and this needs ${sizeText(adding)} more: delete batches or presets it no longer needs`,
      { stored_bytes: held, adding_bytes: adding, quota_bytes: this.quotaBytes },
    );
  }

  /**
   * Counts `bytes` stored for the workspace (negative: deleted), once they are. Resolves once
   * written; a count that cannot be written is told to `onTrouble` and leaves the total short or
   * long by it.
   */
  add(workspaceId: string, bytes: number): Promise<void> {
    if (!bytes) return Promise.resolve();
    const seen = this.seen.peek(workspaceId);
    if (seen) seen.bytes += bytes;
    if (this.closed) {
      this.onTrouble(new Error('storage quota writer closed'), { workspace_id: workspaceId, bytes });
      return Promise.resolve();
    }
    const waiting = this.queued.get(workspaceId);
    if (waiting) {
      waiting.bytes += bytes;
      return waiting.written;
    }
    const entry = { bytes, written: Promise.resolve() };
    entry.written = (this.writing.get(workspaceId) ?? this.started)
      .then(() => {
        this.queued.delete(workspaceId); // counts from now on wait for the next write
        return this.write(workspaceId, entry.bytes);
      })
      .catch((err: unknown) => this.onTrouble(err, { workspace_id: workspaceId, bytes: entry.bytes }));
    this.queued.set(workspaceId, entry);
    this.writing.set(workspaceId, entry.written);
    void entry.written.then(() => {
      if (this.writing.get(workspaceId) === entry.written) this.writing.delete(workspaceId);
    });
    return entry.written;
  }

  /** Once the writes queued are done, puts the writer in the pool for the next process to take. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.started;
    await Promise.all(this.writing.values());
    await pool(this.store).insertOne({ _id: this.id, retired_at: new Date() });
  }

  private async write(workspaceId: string, bytes: number): Promise<void> {
    const _id = `${workspaceId}:${this.id}`;
    let current = this.mine.get(workspaceId);
    current ??= (await storedBytes(this.store).findOne({ _id }))?.bytes ?? 0;
    const value = current + bytes;
    try {
      await storedBytes(this.store).replaceOne(
        { _id },
        { workspace_id: workspaceId, writer: this.id, bytes: value, updated_at: new Date() },
        { upsert: true },
      );
    } catch (err) {
      this.mine.delete(workspaceId); // written or not: read again before the next write
      throw err;
    }
    this.mine.set(workspaceId, value);
  }
}
