// Where a batch's line-level documents live: in collections shared by every batch (`batch_inputs`,
// `batch_results`, `batch_progress`), each document's `_id` the batch id and its own key
// (`<batch id>:<seqId>`). Every read and write is by `_id`, and a new batch creates no collection:
// on FerretDB each collection is a table with catalogue entries that every later operation pays
// for, and on MongoDB thousands of collections are an anti-pattern too.
import type { Document } from 'mongodb';
import type { Store } from '../../infrastructure/store';
import type { BatchRef } from './store';
import { withFields } from '../../infrastructure/objects/with-fields';

/**
 * Chunk, progress and result ids are zero-padded strings, not numbers: FerretDB turns only a
 * string (or ObjectId) `_id` equality into an indexed SQLite lookup, and padding keeps their
 * lexical order the numeric one.
 */
export function seqId(n: number): string {
  return n.toString().padStart(9, '0');
}

/** The shared collection of one kind, and the `_id` of the batch's document with a given key. */
export function place<T extends Document>(store: Store, b: BatchRef, kind: 'inputs' | 'results' | 'progress') {
  return { coll: store.db.collection<T>(`batch_${kind}`), id: (key: string) => `${b._id}:${key}` };
}

/** A stored document with its batch-local `_id` back (the key the rest of the code uses). */
export const local = <T extends { _id: string }>(doc: T): T => withFields(doc, { _id: doc._id.slice(doc._id.lastIndexOf(':') + 1) }) as T;
