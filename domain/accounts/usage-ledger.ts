// The one writer of usage records (the debit side of the credits ledger), with group commit:
// records that arrive while a write is in flight wait and go together in the next `insertMany`,
// so under load many billed calls share one round trip, and a lone call waits for no timer.
// A record's `_id` is its generation id: a retried call finds its record already there and is not
// debited twice.
//
// One ledger per process. A caller's promise settles once its record is safe: `recordStored` once
// the database has it (or refused it), for work another process may take over (activities); `record`
// once the record's line is written to the process's journal (domain/accounts/usage-journal), for
// the API's synchronous calls, when the process has one (else as `recordStored`). A journaled
// record's database write follows in the background, retried through an outage, and a record that
// never got there is adopted from the journal by the next process. Until it is stored,
// `generation` and `unstoredCost` still see it.
import { randomBytes } from 'node:crypto';
import { ServiceUnavailableError } from '../../infrastructure/errors';
import { fromJsonText, toJsonText } from '../../infrastructure/store/json-text';
import { insertManyEach, type Store, type UsageDoc, type UsageFields } from '../../infrastructure/store';
import { fromStoredUsage, toStoredUsage } from '../../infrastructure/store/usage-form';
import { journalLine, takeCheckpointMark, type Segment, type UsageJournal } from './usage-journal';
import { TotalsWriter } from './usage-totals';
import type { RequestMeta } from './attribution';
import type { Usage } from '../../infrastructure/providers/formats';
import { withFields } from '../../infrastructure/objects/with-fields';
import { withinMs } from '../../infrastructure/concurrency/within-ms';

/** A usage record as billing code builds it: the caller's trace as an object; stored with its writer's stamp. */
export type UsageRecord = Omit<UsageFields, 'created_at' | 'trace' | 'details' | 'writer' | 'group'> & {
  trace: Record<string, unknown> | null;
  details?: Record<string, unknown>;
  created_at?: Date;
};

/** A stored record's details as an object, whichever form it was stored in. */
export function usageDetails(doc: Pick<UsageDoc, 'details'>): Record<string, unknown> | null {
  if (doc.details === undefined) return null;
  return typeof doc.details === 'string' ? fromJsonText<Record<string, unknown>>(doc.details) : doc.details;
}

interface Pending {
  doc: UsageDoc;
  /** Journaled records: the segment whose line this is; the caller was answered already. */
  segment?: Segment;
  resolve?: (recorded: boolean) => void;
  reject?: (err: unknown) => void;
}

/** The most records one insert carries. */
const MAX_GROUP = 1_000;
/**
 * What journaled records waiting for the database may hold in memory before more are refused, each
 * counted as its journal line plus what its objects take beyond it (~0.75 KB, measured): about
 * 90,000 ordinary records, fewer when their callers' trace metadata is large.
 */
const MAX_BACKLOG_BYTES = 128 * 1024 * 1024;
const RECORD_OVERHEAD_BYTES = 1_024;
/** After a failed write the next waits this long, doubling up to the cap. */
const RETRY_FIRST_MS = 100;
const RETRY_MAX_MS = 5_000;
/**
 * How long a journaled record waits for others to share its insert. An insert and its totals update
 * cost the embedded FerretDB about 1 ms of CPU whatever the group's size, on top of ~0.05 ms per
 * record: at 20 ms FerretDB spent 0.18-0.20 ms per call at c=1 and 0.10-0.12 at c=50, at 50 ms
 * 0.13-0.17 and 0.09. The record is safe in the journal meanwhile; only other processes see it later.
 */
export const JOURNAL_GROUP_MS = 50;
/** How long the ledger is idle before its totals are settled (their pending group cleared). */
const SETTLE_IDLE_MS = 1_000;
/** How often a journaling ledger looks for dead processes' journals. */
const ADOPT_EVERY_MS = 10_000;

export interface LedgerOptions {
  /** Told of each record once it is stored (metrics: spend). */
  onRecorded?: (doc: UsageDoc) => void;
  journal?: UsageJournal;
  /** Told of what the background writer could not do (journaling ledgers only). */
  onTrouble?: (message: string, details: Record<string, unknown>) => void;
  /** Overrides MAX_BACKLOG_BYTES (tests). */
  maxBacklogBytes?: number;
}

export class UsageLedger {
  private queue: Pending[] = [];
  private writing = false;
  /** Round trips made so far, for tests and the benchmark: records ÷ writes is the grouping. */
  writes = 0;
  /** Journaled records not yet stored, by generation id. */
  private readonly unstored = new Map<string, { doc: UsageDoc; bytes: number }>();
  private unstoredBytes = 0;
  private readonly unstoredByWorkspace = new Map<string, number>();
  private retryMs = RETRY_FIRST_MS;
  private retryTimer: NodeJS.Timeout | null = null;
  private settleTimer: NodeJS.Timeout | null = null;
  private adopter: NodeJS.Timeout | null = null;
  private idle: (() => void)[] = [];
  private closed = false;
  /** The journal refused the last record it was given (recorded in the database instead). */
  private failing = false;
  /** This ledger's running totals per workspace (what makes a balance a few reads). */
  private readonly totals: TotalsWriter;

  constructor(
    private readonly store: Store,
    private readonly opts: LedgerOptions = {},
  ) {
    this.totals = new TotalsWriter(store);
    if (opts.journal) {
      this.adoptOrphans();
      this.adopter = setInterval(() => this.adoptOrphans(), ADOPT_EVERY_MS).unref();
    }
  }

  /** Resolves true once the database has the record, false when that generation was already recorded. */
  recordStored(usage: UsageRecord): Promise<boolean> {
    const doc = toDoc(usage);
    return new Promise((resolve, reject) => this.enqueue({ doc, resolve, reject }));
  }

  /** Resolves true once the record is journaled (stored, without a journal), false when that generation was already recorded. */
  record(usage: UsageRecord): Promise<boolean> {
    const { journal } = this.opts;
    if (!journal) return this.recordStored(usage);
    const doc = toDoc(usage);
    const line = journalLine(doc);
    const bytes = line.length + RECORD_OVERHEAD_BYTES;
    if (this.unstoredBytes + bytes > (this.opts.maxBacklogBytes ?? MAX_BACKLOG_BYTES)) {
      return Promise.reject(new ServiceUnavailableError('Usage records cannot be stored right now; try again shortly'));
    }
    return journal.appendSoon(line).then(
      (segment) => {
        if (this.failing) this.journalTrouble(null);
        if (this.closed) return true; // journaled as the ledger closed: the next start stores it
        this.enqueue({ doc, segment });
        this.unstored.set(doc._id, { doc, bytes });
        this.unstoredBytes += bytes;
        this.unstoredByWorkspace.set(doc.workspace_id, (this.unstoredByWorkspace.get(doc.workspace_id) ?? 0) + doc.cost);
        return true;
      },
      // The journal cannot take it (a full disk, a read-only volume): the provider has answered, so
      // the record goes to the database instead, before the answer, as it does without a journal.
      (err: unknown) => {
        this.journalTrouble(err);
        return this.recordStored(usage);
      },
    );
  }

  /** Says once when the journal stops taking records, and once when it takes them again. */
  private journalTrouble(err: unknown): void {
    if (err === null) {
      this.failing = false;
      this.opts.onTrouble?.('usage journal written again', {});
    } else if (!this.failing) {
      this.failing = true;
      this.opts.onTrouble?.('usage journal cannot be written: each usage record goes to the database before its answer', { err });
    }
  }

  /** Whether the journal refused the last record it was given (`gateway_usage_journal_failing`). */
  get journalFailing(): boolean {
    return this.failing;
  }

  /** Journaled records waiting for the database, counted as the backlog bound counts them (`gateway_usage_unstored_bytes`). */
  get backlogBytes(): number {
    return this.unstoredBytes;
  }

  /** One generation's usage record, if it belongs to the workspace (stored or still on its way). */
  async generation(workspaceId: string, id: string): Promise<UsageDoc | null> {
    const unstored = this.unstored.get(id)?.doc;
    const stored = unstored ? null : await this.store.usage.findOne({ _id: id });
    const doc = unstored ?? (stored && fromStoredUsage(stored));
    return doc && doc.workspace_id === workspaceId ? doc : null;
  }

  /** What this process has recorded for the workspace that the database does not show yet. */
  unstoredCost(workspaceId: string): number {
    return this.unstoredByWorkspace.get(workspaceId) ?? 0;
  }

  /** Resolves once every record so far is stored (or refused). */
  flushed(): Promise<void> {
    if (!this.writing && !this.queue.length) return Promise.resolve();
    return new Promise((resolve) => this.idle.push(resolve));
  }

  /** Waits up to `graceMs` for the database to take what is queued; the journal keeps the rest. */
  async close(graceMs: number): Promise<void> {
    this.closed = true;
    if (this.adopter) clearInterval(this.adopter);
    const deadline = Date.now() + graceMs;
    const flushed = await withinMs(
      this.flushed().then(() => true),
      graceMs,
      false,
    );
    if (this.retryTimer) clearTimeout(this.retryTimer);
    if (this.settleTimer) clearTimeout(this.settleTimer);
    if (flushed && !this.writing && !this.queue.length) {
      // Everything is stored: the next ledger to start takes this writer on (see usage-totals.ts).
      // No write may start meanwhile, nor after, if the database does not answer in time.
      this.writing = true;
      const retiring = this.totals.retire().then(
        () => true,
        (err: unknown) => {
          this.opts.onTrouble?.('usage totals writer not retired', { err });
          return true;
        },
      );
      if (await withinMs(retiring, Math.max(0, deadline - Date.now()), false)) this.nowIdle();
    }
    // Journaled records wait in the journal for the next start; a caller waiting for the database is told.
    for (const p of this.queue) p.reject?.(new ServiceUnavailableError('Usage records cannot be stored right now; try again shortly'));
    this.queue = [];
    this.opts.journal?.close();
  }

  /**
   * A stream's checkpoints: `save` journals what it has produced so far (replacing the previous
   * checkpoint), `end` drops the last once the stream's own record is written. Null without a journal.
   */
  checkpoints(): { save(usage: UsageRecord): void; end(): void } | null {
    const { journal } = this.opts;
    if (!journal) return null;
    let last: Segment | null = null;
    const release = () => {
      if (last) journal.confirm(last);
      last = null;
    };
    return {
      save: (usage) => {
        try {
          const next = journal.append(toDoc(usage), true);
          if (this.failing) this.journalTrouble(null);
          release();
          last = next;
        } catch (err) {
          // The stream goes on; its record is stored when it ends. Said once, not per checkpoint.
          this.journalTrouble(err);
        }
      },
      end: release,
    };
  }

  private adoptOrphans(): void {
    const journal = this.opts.journal!;
    try {
      const adopted = journal.adoptOrphans((file, line) => this.opts.onTrouble?.('unreadable usage journal line skipped', { file, line }));
      // A dead process's streams: bill the last checkpoint of each whose own record is not there.
      const lines = adopted.flatMap(({ segment, docs }) => docs.map((doc) => ({ doc, segment, checkpoint: takeCheckpointMark(doc) })));
      const finals = new Set(lines.filter((l) => !l.checkpoint).map((l) => l.doc._id));
      const lastCheckpoint = new Map<string, (typeof lines)[number]>();
      for (const l of lines) if (l.checkpoint && !finals.has(l.doc._id)) lastCheckpoint.set(l.doc._id, l);
      for (const { segment, docs } of adopted) {
        this.opts.onTrouble?.('adopted a usage journal left by a stopped process', { file: segment.file, records: docs.length });
      }
      for (const l of lines) {
        // Not counted as unstored: their cost was never part of this process's own spending.
        if (!l.checkpoint || lastCheckpoint.get(l.doc._id) === l) this.enqueue({ doc: l.doc, segment: l.segment });
        else journal.confirm(l.segment); // superseded: nothing to store
      }
    } catch (err) {
      this.opts.onTrouble?.('usage journal could not be scanned', { err });
    }
  }

  private enqueue(p: Pending): void {
    this.queue.push(p);
    if (!this.writing) this.enqueueDrain();
  }

  private enqueueDrain(): void {
    this.writing = true;
    // Let records finished in the same turn of the event loop join the first write. Journaled
    // records are safe already: they wait a few milliseconds more, so that one insert carries
    // several even at low concurrency (each insert and its totals update cost the database ~1 ms
    // of CPU). Not when a caller waits for the database, or a group is full.
    const wait = this.opts.journal && this.queue.length < MAX_GROUP && this.queue.every((p) => p.segment);
    if (wait) setTimeout(() => void this.drain(), JOURNAL_GROUP_MS);
    else setImmediate(() => void this.drain());
  }

  private async drain(): Promise<void> {
    if (!(await this.writeGroup())) return; // a retry is scheduled
    // What arrived during the write gathers for a while too: written at once, each insert carried
    // only the one or two records a write's duration lets in, at c=1 one insert per two calls.
    if (this.queue.length) return this.enqueueDrain();
    this.nowIdle();
    // Idle a while: the totals lose their pending group, so readers need no lookup. Not at once:
    // under steady load the next group's write does it, and a lone call costs one write, not two.
    this.settleTimer ??= setTimeout(() => void this.settleIdle(), SETTLE_IDLE_MS);
    this.settleTimer.unref();
  }

  private async settleIdle(): Promise<void> {
    this.settleTimer = null;
    if (this.writing || this.closed) return; // the running or next write carries the totals
    this.writing = true;
    // A failure costs readers a lookup until the next group's write, which tries again.
    await this.totals.settle().catch((err: unknown) => this.opts.onTrouble?.('usage totals could not be settled', { err }));
    if (this.queue.length) this.enqueueDrain();
    else this.nowIdle();
  }

  private nowIdle(): void {
    this.writing = false;
    for (const resolve of this.idle.splice(0)) resolve();
  }

  /** Writes the queue's next group; false when a journaled write failed and was scheduled again. */
  private async writeGroup(): Promise<boolean> {
    const group = this.queue.slice(0, MAX_GROUP);
    const docs = group.map((p) => p.doc);
    this.writes++;
    let outcomes: Awaited<ReturnType<typeof insertManyEach>>;
    try {
      await this.totals.begin(docs);
      outcomes = await insertManyEach(this.store.usage, docs.map(toStoredUsage));
      this.totals.inserted(docs, outcomes);
    } catch (err) {
      this.totals.failed(docs);
      const journaled = group.filter((p) => p.segment);
      if (journaled.length) {
        // Callers waiting for the database are told now (they have retries of their own); journaled records wait.
        const waiting = new Set(group.filter((p) => !p.segment));
        if (waiting.size) this.queue = this.queue.filter((p) => !waiting.has(p));
        for (const p of waiting) p.reject!(err);
        if (this.closed) return false; // the journal keeps them for the next start
        // Keep the group and try again after a pause (not in a loop against the database).
        this.opts.onTrouble?.('usage records could not be stored; retrying', { err, records: journaled.length, retry_ms: this.retryMs });
        this.retryTimer = setTimeout(() => void this.drain(), this.retryMs);
        this.retryMs = Math.min(this.retryMs * 2, RETRY_MAX_MS);
        return false;
      }
      outcomes = group.map(() => err as Error);
    }
    this.retryMs = RETRY_FIRST_MS;
    this.queue.splice(0, group.length);
    group.forEach((p, i) => this.settle(p, outcomes[i]));
    return true;
  }

  private settle(p: Pending, outcome: 'inserted' | 'existing' | Error): void {
    if (outcome === 'inserted') this.opts.onRecorded?.(p.doc);
    if (!p.segment) {
      if (outcome instanceof Error) p.reject!(outcome);
      else p.resolve!(outcome === 'inserted');
      return;
    }
    if (outcome instanceof Error) {
      // The database refused this one record for good: retrying would not help.
      this.opts.onTrouble?.('usage record refused by the database; dropped', { err: outcome, generation_id: p.doc._id });
    }
    const unstored = this.unstored.get(p.doc._id);
    if (unstored) {
      this.unstored.delete(p.doc._id);
      this.unstoredBytes -= unstored.bytes;
      const left = (this.unstoredByWorkspace.get(p.doc.workspace_id) ?? 0) - p.doc.cost;
      if (left > 1e-12) this.unstoredByWorkspace.set(p.doc.workspace_id, left);
      else this.unstoredByWorkspace.delete(p.doc.workspace_id);
    }
    this.opts.journal!.confirm(p.segment);
  }
}

/** What a call is billed for besides its prompt and completion tokens at their prices: its record keeps the counts (GET /generation shows them). */
const BILLED_EXTRAS = [
  'cache_read_tokens',
  'cache_write_tokens',
  'cache_write_1h_tokens',
  'web_searches',
  'audio_input_tokens',
  'audio_output_tokens',
  'images',
] as const;
export type BilledExtra = (typeof BILLED_EXTRAS)[number];

/** The counts of BILLED_EXTRAS a call's usage has, if any (kept in its record's details). */
function beyondTokens(u: Usage): Partial<Record<BilledExtra, number>> | null {
  let out: Partial<Record<BilledExtra, number>> | null = null;
  for (const k of BILLED_EXTRAS) if (u[k]) (out ??= {})[k] = u[k];
  return out;
}

/**
 * A billed call's usage record, the one place its fields are laid out: who called, what served it,
 * what it used and cost, and the attribution its request carried.
 */
export function usageRecordOf(
  call: {
    generationId: string;
    workspaceId: string;
    keyId: string;
    kind: UsageDoc['kind'];
    meta: Pick<RequestMeta, 'session_id' | 'user' | 'app'> & { trace?: RequestMeta['trace'] };
    batchId?: string | null;
  },
  served: { model: string; provider: string | null; usage: Usage; cost: number },
  details?: Record<string, unknown>,
): UsageRecord {
  const billed = beyondTokens(served.usage);
  if (billed) details = withFields(details ?? {}, billed);
  return {
    _id: call.generationId,
    workspace_id: call.workspaceId,
    key_id: call.keyId,
    kind: call.kind,
    model: served.model,
    provider: served.provider,
    input_tokens: served.usage.input_tokens,
    output_tokens: served.usage.output_tokens,
    cost: served.cost,
    session_id: call.meta.session_id,
    user: call.meta.user,
    trace: call.meta.trace ?? null,
    app: call.meta.app,
    batch_id: call.batchId ?? null,
    ...(details && { details }),
  };
}

/**
 * The document of a usage record; the caller's trace and the call's details as their JSON text.
 * Attribution that is absent (null, an app with nothing set) is left out (see UsageFields).
 */
function toDoc(usage: UsageRecord): UsageDoc {
  const { session_id, user, trace, app, batch_id, details, created_at, ...rest } = usage;
  const doc: Record<string, unknown> = rest;
  if (details) doc.details = toJsonText(details);
  if (session_id != null) doc.session_id = session_id;
  if (user != null) doc.user = user;
  if (trace != null) doc.trace = toJsonText(trace);
  if (app && (app.referer !== null || app.title !== null || app.categories.length)) doc.app = app;
  if (batch_id != null) doc.batch_id = batch_id;
  doc.created_at = created_at ?? new Date();
  return doc as UsageDoc;
}

/** Random bytes drawn in blocks: one `randomBytes` call per 400 ids, not one per call (it showed in the profile). */
const RANDOM_BLOCK = 4_000;
let randomPool = Buffer.alloc(0);
let randomAt = 0;

/** A new generation id: time-ordered, then 80 random bits. */
export function newGenerationId(prefix = 'gen-'): string {
  if (randomAt + 10 > randomPool.length) {
    randomPool = randomBytes(RANDOM_BLOCK);
    randomAt = 0;
  }
  const random = randomPool.toString('hex', randomAt, randomAt + 10);
  randomAt += 10;
  return `${prefix}${Date.now().toString(36)}${random}`;
}
