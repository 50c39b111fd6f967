// Writers of per-writer documents (`<workspace>:<writer>`, written only by their writer: safe on
// FerretDB, which loses concurrent updates to one document) outlive their processes: a writer that
// closed with everything written is put in a pool, and the next process to start takes it and goes
// on writing its documents. Else each process start added a document to every workspace it wrote
// for, and reading a workspace's total grew with restarts.
import type { Collection, Document } from 'mongodb';

/** How many pooled writers a starting process tries to take before making a new one. */
const TAKE_TRIES = 8;

/**
 * A pooled writer's document, taken out of the pool. Deleting it is the claim: of concurrent
 * deletes of one document exactly one deletes it (on FerretDB as on MongoDB), so no two processes
 * ever share a writer. Null when the pool is empty or cannot be read: the caller makes a new writer.
 */
export async function takePooledWriter<T extends Document & { _id: string }>(pool: Collection<T>): Promise<T | null> {
  try {
    const found = (await pool.find({}).limit(TAKE_TRIES).toArray()) as T[];
    for (const w of found) {
      if ((await pool.deleteOne({ _id: w._id } as never)).deletedCount === 1) return w;
    }
  } catch {
    // a new writer: correct, only one more document for each workspace it writes for
  }
  return null;
}
