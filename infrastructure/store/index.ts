// The MongoDB connection and the collections the gateway keeps. FerretDB (the embedded default)
// has no transactions and scans everything but `_id` lookups, so writes are idempotent by `_id`.
import {
  MongoClient,
  MongoNetworkError,
  type AnyBulkWriteOperation,
  type Collection,
  type Db,
  type Document,
  type FindCursor,
  type MongoClientOptions,
} from 'mongodb';
import type { StoredUsageDoc } from './usage-form';

export interface ProbeDoc extends Document {
  _id: string;
  note: string;
  written_at: Date;
}

export interface WorkspaceDoc extends Document {
  _id: string; // UUID
  name: string;
  created_at: Date;
  /** Account-wide routing settings, merged with per-request provider preferences. */
  settings: { ignore?: string[]; only?: string[] };
  /** Signs this workspace's webhooks; made on first use, replaced on rotation. */
  webhook_secret?: string;
}

export type KeyKind = 'inference' | 'management';

export interface ApiKeyDoc extends Document {
  /** SHA-256 of the key: authentication is one `_id` lookup, the only fast query on FerretDB. */
  _id: string;
  id: string; // public id, `key_…`
  workspace_id: string;
  kind: KeyKind;
  name: string;
  /** First characters of the key, for people to recognise it; never enough to use it. */
  label: string;
  created_at: Date;
  revoked_at: Date | null;
}

export interface CreditGrantDoc extends Document {
  _id: string; // <workspace id>:<uuid>: a workspace's grants are one `_id` range
  workspace_id: string;
  amount: number; // USD
  note: string;
  created_at: Date;
}

/** One billable call. `_id` is the generation id, so recording it twice is impossible. Stored packed (usage-form). */
export interface UsageDoc extends Document, UsageFields {}

/** A usage record's fields, apart from the driver's Document (whose index signature would make every field optional to `Omit`). */
export interface UsageFields {
  _id: string;
  workspace_id: string;
  key_id: string;
  kind: 'decision' | 'batch_line' | 'completion';
  model: string;
  provider: string | null;
  input_tokens: number;
  output_tokens: number;
  cost: number; // USD, debited from the workspace balance
  // The attribution below is kept only when there is some (`toDoc` in usage-ledger): a call without
  // a session, user, trace, app or batch is the common case, and its record is shorter to journal
  // and store without them.
  session_id?: string | null;
  user?: string | null;
  /** The caller's trace object as JSON text (infrastructure/store/json-text). */
  trace?: string | null;
  app?: { referer: string | null; title: string | null; categories: string[] };
  batch_id?: string | null;
  /**
   * Extra facts about the call (how it ended, the label mass of logprob-answered decisions), as JSON
   * text like `trace`: its keys include callers' question names, which as an object would come back
   * wrong from the journal's Extended JSON (a question named `$date` read as a date). An object in
   * records of earlier versions (`usageDetails` reads both).
   */
  details?: string | Record<string, unknown>;
  created_at: Date;
  /** The ledger that stored it and its insert group (domain/accounts/usage-totals). */
  writer: string;
  group: number;
}

export interface PresetDoc extends Document {
  _id: string; // name-based UUID of workspace + slug: creating one slug twice collides
  workspace_id: string;
  slug: string;
  name: string;
  description: string | null;
  creator_user_id: string;
  created_at: Date;
  /** A version known to exist, raised as versions are added: where the search for the newest starts. */
  latest?: number;
  /** When its newest version was added, raised with `latest` (what the list is ordered by, without reading versions). */
  updated_at?: Date;
  /**
   * Random, set when the preset is created: its versions' ids are named by it, so a slug deleted and
   * created again never reuses a version id (which processes keep, as a version never changes).
   * Absent on presets created before deletion existed.
   */
  life?: string;
}

export interface PresetVersionDoc extends Document {
  _id: string; // name-based UUID of preset + number: two writers of one number collide
  preset_id: string;
  workspace_id: string;
  version: number;
  /** JSON text (infrastructure/store/json-text). */
  config: string;
  system_prompt: string | null;
  creator_id: string;
  created_at: Date;
}

/** A request admitted in one rate-limit window: `_id` = key id : window : ticket number. */
export interface RateTicketDoc extends Document {
  _id: string;
  key_id: string;
  window: number;
}

const RATE_TICKETS = 'rate_tickets_';
/** Where earlier versions kept every window's rate-limit blocks. */
const LEGACY_RATE_TICKETS = 'rate_tickets';

/** An index on usage records that earlier versions made and nothing reads. */
const LEGACY_USAGE_INDEX = 'workspace_id_1_created_at_-1';

export class Store {
  /** False from a failed check of the server until a check succeeds: requests can fail fast meanwhile. */
  private answering = true;
  /** Per window length, the period before which rate-limit collections were last dropped. */
  private readonly ticketsDroppedBefore = new Map<number, number>();

  private constructor(
    readonly client: MongoClient,
    readonly db: Db,
    /**
     * FerretDB, not MongoDB. It sorts in memory whatever the sort: a sorted read of an `_id` range
     * reads the whole range before its limit; unsorted, it returns an `_id` range in index order
     * (devstack/binaries.ts). And its update commands are sent in parts (`bulkWriteInParts`).
     */
    readonly ferretdb: boolean,
  ) {
    client.on('serverHeartbeatFailed', () => (this.answering = false));
    client.on('serverHeartbeatSucceeded', () => (this.answering = true));
  }

  /** Whether the database answered its last check (every 2 s). */
  get reachable(): boolean {
    return this.answering;
  }

  /** Until then the database counts as away: an operation just failed to reach it, or stalled. */
  private awayUntil = 0;

  /** The database failed its last check, or an operation waited on `patiently` just did not get through. */
  get away(): boolean {
    return !this.answering || Date.now() < this.awayUntil;
  }

  /**
   * Waits up to `ms` for `op`: its value, or null when it could not reach the database or has not
   * answered by then (it goes on, its outcome dropped). Then the database counts as away for `ms`,
   * so a caller with a fallback (a key as last read, a rate limit failing open) takes it at once
   * instead of each request waiting to find out again. Any other error is thrown.
   */
  async patiently<T>(op: Promise<T>, ms: number): Promise<{ value: T } | null> {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<null>((resolve) => (timer = setTimeout(() => resolve(null), ms)));
    try {
      const out = await Promise.race([op.then((value) => ({ value })), late]);
      if (out) return out;
      op.catch(() => undefined);
    } catch (err) {
      if (!isDatabaseUnavailable(err)) throw err;
    } finally {
      clearTimeout(timer);
    }
    this.awayUntil = Date.now() + ms;
    return null;
  }

  static async connect(uri: string, database: string, options: MongoClientOptions = {}): Promise<Store> {
    const client = new MongoClient(uri, {
      ...options,
      // A database that stops answering (down, frozen) is noticed within seconds: the monitor checks
      // every 2 s and gives up on a check after 2 s, which fails the operations waiting on it, so
      // what needs the database answers a 503 soon instead of hanging (the key cache, rate limiter
      // and usage journal carry the rest of the request path through the outage).
      heartbeatFrequencyMS: 2_000,
      serverSelectionTimeoutMS: 3_000,
      connectTimeoutMS: 2_000,
      // FerretDB has no sessions/transactions; a standalone needs no retryable-write txn numbers.
      retryWrites: false,
      appName: 'inference-gateway',
    });
    await client.connect();
    const info = await client.db(database).admin().command({ buildInfo: 1 });
    const store = new Store(client, client.db(database), Boolean(info.ferretdbVersion));
    await store.ensureIndexes();
    return store;
  }

  get probes(): Collection<ProbeDoc> {
    return this.db.collection<ProbeDoc>('probes');
  }

  get workspaces(): Collection<WorkspaceDoc> {
    return this.db.collection<WorkspaceDoc>('workspaces');
  }

  get apiKeys(): Collection<ApiKeyDoc> {
    return this.db.collection<ApiKeyDoc>('api_keys');
  }

  get creditGrants(): Collection<CreditGrantDoc> {
    return this.db.collection<CreditGrantDoc>('credit_grants');
  }

  /** Stored packed (usage-form): read a record with `fromStoredUsage`. */
  get usage(): Collection<StoredUsageDoc> {
    return this.db.collection<StoredUsageDoc>('usage');
  }

  /**
   * Rate-limit blocks of windows `windowSeconds` long that start in `period` (a day, or as many
   * days as a window lasts): a collection per period, so blocks nobody will delete (a stopped
   * process's) go with their collection, as FerretDB has no TTL index.
   */
  rateTickets(windowSeconds: number, period: number): Collection<RateTicketDoc> {
    return this.db.collection<RateTicketDoc>(`${RATE_TICKETS}${windowSeconds}s_${period}`);
  }

  /**
   * Drops the rate-limit collections of windows `windowSeconds` long from periods before `period`,
   * and the one collection of earlier versions. Reads the catalog, not the blocks; once per period
   * and window length for all of this process's limiters.
   */
  async dropRateTicketsBefore(windowSeconds: number, period: number): Promise<void> {
    if ((this.ticketsDroppedBefore.get(windowSeconds) ?? -Infinity) >= period) return;
    this.ticketsDroppedBefore.set(windowSeconds, period);
    const prefix = `${RATE_TICKETS}${windowSeconds}s_`;
    const names = (await this.db.listCollections({}, { nameOnly: true }).toArray())
      .map((c) => c.name)
      .filter((n) => n === LEGACY_RATE_TICKETS || (n.startsWith(prefix) && Number(n.slice(prefix.length)) < period));
    // Another process may drop the same collection first: already gone is done.
    await Promise.all(names.map((n) => this.db.dropCollection(n).catch((err) => (isNamespaceMissing(err) ? true : Promise.reject(err)))));
  }

  get presets(): Collection<PresetDoc> {
    return this.db.collection<PresetDoc>('presets');
  }

  get presetVersions(): Collection<PresetVersionDoc> {
    return this.db.collection<PresetVersionDoc>('preset_versions');
  }

  get endpointSamples(): Collection<EndpointSamplesDoc> {
    return this.db.collection<EndpointSamplesDoc>('endpoint_samples');
  }

  /** Idempotent; run at start-up by every process. */
  async ensureIndexes(): Promise<void> {
    await this.workspaces.createIndex({ name: 1 }, { unique: true });
    await this.apiKeys.createIndex({ id: 1 }, { unique: true });
    // Usage records are read by `_id` only (usage-totals), so a secondary index would only add to
    // every insert (about 15% of FerretDB's CPU per record); databases made before this lose theirs.
    await this.usage.dropIndex(LEGACY_USAGE_INDEX).catch(() => undefined);
  }

  /** Round trip to the server, bounded so a dead database answers quickly. */
  async ping(timeoutMs = 2_000): Promise<void> {
    await withTimeout(this.db.command({ ping: 1 }), timeoutMs, 'MongoDB ping timed out');
  }

  async close(): Promise<void> {
    await this.client.close();
  }
}

async function withTimeout<T>(p: Promise<T>, ms: number, message: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      p,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(message)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * The `_id` range of a workspace's documents in a collection keyed `<workspace>:<key>` (keys of
 * plain characters, which sort below `~`): one indexed range read on FerretDB's patched build.
 */
export function workspaceRange(workspaceId: string): { $gte: string; $lt: string } {
  return { $gte: `${workspaceId}:`, $lt: `${workspaceId}:~` };
}

/** A workspace's list of one kind (keys, presets): `<workspace>:<id>` → the listed document's `_id`. */
export interface WorkspaceListDoc extends Document {
  _id: string;
  ref: string;
}

export function workspaceList(store: Store, name: 'workspace_keys' | 'workspace_presets'): Collection<WorkspaceListDoc> {
  return store.db.collection<WorkspaceListDoc>(name);
}

/** Lists `ref` under the workspace (idempotent: written before the listed document, so never missing). */
export async function listUnder(store: Store, name: Parameters<typeof workspaceList>[1], workspaceId: string, id: string, ref: string) {
  await workspaceList(store, name).replaceOne({ _id: `${workspaceId}:${id}` }, { ref }, { upsert: true });
}

/**
 * A read of an `_id` range in `_id` order that stops at its limit: sorted on MongoDB (by the `_id`
 * index), unsorted on FerretDB, whose patched build reads the range from the index in order.
 */
export function inIdOrder<T>(store: Store, cursor: FindCursor<T>): FindCursor<T> {
  return store.ferretdb ? cursor : cursor.sort({ _id: 1 });
}

/** Statements per update command sent to FerretDB (see `bulkWriteInParts`). */
const UPDATE_STATEMENTS = 16;

/**
 * `bulkWrite`, on FerretDB in commands of at most UPDATE_STATEMENTS statements, one after another.
 * FerretDB 1.24 as published holds one of its 100 SQLite connections per statement of an update
 * command until the command ends: one command of 100 statements, or four of 40 at once, waited
 * forever, and the whole database with it. The embedded build is patched (devstack/binaries.ts);
 * a MONGODB_URI may name a FerretDB that is not.
 */
export async function bulkWriteInParts<T extends Document>(
  store: Store,
  coll: Collection<T>,
  ops: AnyBulkWriteOperation<T>[],
): Promise<void> {
  const part = store.ferretdb ? UPDATE_STATEMENTS : ops.length;
  for (let i = 0; i < ops.length; i += part) await coll.bulkWrite(ops.slice(i, i + part), { ordered: false });
}

/** Errors that say the database cannot be reached right now (down, frozen, restarting), not that a request was wrong. */
const UNAVAILABLE = new Set([
  'MongoServerSelectionError',
  'MongoTopologyClosedError',
  'MongoNotConnectedError',
  'MongoOperationTimeoutError',
  'MongoWaitQueueTimeoutError',
  'MongoServerClosedError',
]);

export function isDatabaseUnavailable(err: unknown, depth = 0): boolean {
  if (!err || typeof err !== 'object' || depth > 3) return false;
  // MongoNetworkError covers timeouts and a pool cleared under an operation (PoolClearedOnNetworkError).
  if (err instanceof MongoNetworkError || UNAVAILABLE.has((err as Error).name)) return true;
  // A bulk write (insertMany) that lost its connection wraps the network error, with no write errors.
  const e = err as { cause?: unknown; errorResponse?: unknown; writeErrors?: unknown[] };
  if (e.writeErrors?.length) return false;
  return isDatabaseUnavailable(e.cause, depth + 1) || isDatabaseUnavailable(e.errorResponse, depth + 1);
}

/** MongoDB's OutOfDiskSpace. */
const OUT_OF_DISK_SPACE = 14031;
/** FerretDB's SQLite (SQLITE_FULL) and PostgreSQL, and MongoDB's storage engine, in their own words. */
const DISK_FULL = /database or disk is full|no space left on device|disk_full/i;

/** Errors that say the database's disk is full: it answers, but stores nothing more until room is made. */
export function isDatabaseFull(err: unknown, depth = 0): boolean {
  if (!err || typeof err !== 'object' || depth > 3) return false;
  const e = err as {
    code?: unknown;
    message?: unknown;
    errmsg?: unknown;
    cause?: unknown;
    errorResponse?: unknown;
    writeErrors?: unknown[];
  };
  if (e.code === OUT_OF_DISK_SPACE) return true;
  if (typeof e.message === 'string' && DISK_FULL.test(e.message)) return true;
  if (typeof e.errmsg === 'string' && DISK_FULL.test(e.errmsg)) return true;
  return [e.cause, e.errorResponse, ...(e.writeErrors ?? []).slice(0, 1)].some((inner) => isDatabaseFull(inner, depth + 1));
}

/** True for a unique-index violation (E11000), which FerretDB also reports on insert. */
export function isDuplicateKey(err: unknown): boolean {
  return (err as { code?: number })?.code === 11000;
}

/** True for "ns not found" (code 26): a collection dropped that was not there. */
function isNamespaceMissing(err: unknown): boolean {
  return (err as { code?: number })?.code === 26;
}

/** One endpoint's calls in one process over a few seconds: exact counts, a bounded sample of latency and throughput. */
export interface EndpointSummary {
  e: string;
  ok: number;
  failed: number;
  last_failure: number | null;
  ms: number[];
  tps: number[];
}

/** One process's endpoint measurements over a few seconds (routing/stats.ts); inserted, never updated. */
export interface EndpointSamplesDoc extends Document {
  _id: string;
  at: Date;
  /**
   * The summaries as the JSON text of their list: FerretDB decodes a number of a stored list at a
   * time, and a summary's 128 of them made a document cost 3 ms of its CPU to read (0.4 ms as
   * text). A list in documents written by earlier versions.
   */
  endpoints: string | EndpointSummary[];
}

/** What became of one document of an unordered insert. */
export type InsertOutcome = 'inserted' | 'existing' | Error;

/**
 * Inserts documents as one unordered batch and says what became of each: inserted, already there
 * (a retried write), or refused with its own error. A failure of the whole command (the server is
 * unreachable) is thrown: then nothing is known about any document.
 */
export async function insertManyEach<T extends Document>(coll: Collection<T>, docs: T[]): Promise<InsertOutcome[]> {
  const outcomes: InsertOutcome[] = docs.map(() => 'inserted');
  if (!docs.length) return outcomes;
  try {
    await coll.insertMany(docs as never[], { ordered: false });
  } catch (err) {
    const writeErrors = (err as { writeErrors?: WriteErrorLike[] | WriteErrorLike }).writeErrors;
    const list = Array.isArray(writeErrors) ? writeErrors : writeErrors ? [writeErrors] : [];
    if (!list.length) throw err;
    for (const e of list) outcomes[e.index] = e.code === 11000 ? 'existing' : new Error(e.errmsg ?? `write error ${e.code}`);
  }
  return outcomes;
}

interface WriteErrorLike {
  code?: number;
  index: number;
  errmsg?: string;
}

/**
 * Inserts documents that may already exist (a retried write), as one unordered batch; returns the
 * `_id`s that were already there. Any other write error is thrown.
 */
export async function insertManyNew<T extends Document & { _id: unknown }>(coll: Collection<T>, docs: T[]): Promise<Set<T['_id']>> {
  const outcomes = await insertManyEach(coll, docs);
  const failed = outcomes.find((o): o is Error => o instanceof Error);
  if (failed) throw failed;
  return new Set(docs.filter((_, i) => outcomes[i] === 'existing').map((d) => d._id));
}
