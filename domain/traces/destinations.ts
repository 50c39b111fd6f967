// A workspace's trace destinations: OTLP/HTTP endpoints its generations are also sent to, stored
// under the workspace (`_id` = `<workspace>:<id>`, read as a bounded range) with the headers they
// need (credentials: returned by name only) and whether they want prompts and completions.
import { randomBytes } from 'node:crypto';
import type { Document } from 'mongodb';
import { BadRequestError, NotFoundError } from '../../infrastructure/errors';
import { workspaceRange, type Store } from '../../infrastructure/store';
import { checkCallbackUrl } from '../webhooks/address';

export interface TraceDestinationDoc extends Document {
  _id: string;
  workspace_id: string;
  id: string;
  endpoint: string;
  headers: Record<string, string>;
  include_content: boolean;
  created_at: Date;
}

/** The most destinations one workspace may have. */
const MAX_PER_WORKSPACE = 10;

const destinations = (store: Store) => store.db.collection<TraceDestinationDoc>('trace_destinations');

/** What the API shows of a destination: never its header values. */
export function destinationView(d: TraceDestinationDoc) {
  return {
    id: d.id,
    endpoint: d.endpoint,
    header_names: Object.keys(d.headers),
    include_content: d.include_content,
    created_at: Math.floor(d.created_at.getTime() / 1000),
  };
}

export async function listDestinations(store: Store, workspaceId: string): Promise<TraceDestinationDoc[]> {
  return destinations(store)
    .find({ _id: workspaceRange(workspaceId) })
    .limit(MAX_PER_WORKSPACE + 1)
    .toArray();
}

export async function addDestination(
  store: Store,
  workspaceId: string,
  given: { endpoint: string; headers?: Record<string, string>; include_content?: boolean },
  allowPrivate: boolean,
): Promise<TraceDestinationDoc> {
  const url = await checkCallbackUrl(given.endpoint, allowPrivate, 'endpoint');
  if ((await listDestinations(store, workspaceId)).length >= MAX_PER_WORKSPACE)
    throw new BadRequestError(`A workspace has at most ${MAX_PER_WORKSPACE} trace destinations`);
  const id = `td_${randomBytes(8).toString('hex')}`;
  const doc: TraceDestinationDoc = {
    _id: `${workspaceId}:${id}`,
    workspace_id: workspaceId,
    id,
    endpoint: url.toString(),
    headers: given.headers ?? {},
    include_content: given.include_content === true,
    created_at: new Date(),
  };
  await destinations(store).insertOne(doc);
  return doc;
}

export async function removeDestination(store: Store, workspaceId: string, id: string): Promise<void> {
  const r = await destinations(store).deleteOne({ _id: `${workspaceId}:${id}` });
  if (!r.deletedCount) throw new NotFoundError(`Trace destination ${id} not found`);
}
