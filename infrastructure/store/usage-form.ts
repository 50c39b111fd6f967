// How a usage record is laid out in the `usage` collection. FerretDB (the embedded default) spends
// CPU on every stored field: a record's thirteen fields cost it 0.037-0.043 ms per insert, the same
// record as `_id`, `workspace_id` and one JSON text 0.020-0.026 ms (a record with `_id` alone
// 0.012-0.015). Every call that bills writes one, so the record is stored packed: nothing reads
// records by any field but `_id` (docs/queries.md). `workspace_id`, and `batch_id` when there is
// one, stay fields, for people and tests looking at the collection by hand.
import type { Document } from 'mongodb';
import type { UsageDoc } from './index';
import { fromJsonText, toJsonText } from './json-text';
import { withFields } from '../objects/with-fields';

/** A usage record as stored; records of earlier versions have every field at the top instead. */
export interface StoredUsageDoc extends Document {
  _id: string;
  workspace_id: string;
  batch_id?: string | null;
  /** The record's other fields as JSON text; `created_at` as ISO text. */
  record?: string;
}

export function toStoredUsage(doc: UsageDoc): StoredUsageDoc {
  const { _id, workspace_id, batch_id, ...rest } = doc;
  return { _id, workspace_id, ...(batch_id != null && { batch_id }), record: toJsonText(rest) };
}

/** The record again, whichever form it was stored in. */
export function fromStoredUsage(stored: StoredUsageDoc): UsageDoc {
  const { record, ...top } = stored;
  if (typeof record !== 'string') return stored as UsageDoc;
  const rest = fromJsonText<Omit<UsageDoc, 'created_at'> & { created_at: string }>(record);
  return withFields(withFields(rest, top), { created_at: new Date(rest.created_at) }) as UsageDoc;
}
