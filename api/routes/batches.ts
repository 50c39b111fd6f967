// Batches: created synchronously (shape, model, custom_ids, size, credits), then run by a durable
// workflow whose id is the batch id. Every read is scoped to the key's workspace.
import { Readable } from 'node:stream';
import { Type } from '@sinclair/typebox';
import { BadRequestError, ConflictError, NotFoundError, RateLimitedError, ServiceUnavailableError } from '../../infrastructure/errors';
import { BatchRuns } from '../batch-runs';
import { planNewBatch } from '../../domain/batches/create';
import {
  abandonBatch,
  BatchAbandonedError,
  batchView,
  deleteBatch,
  dropUnpublished,
  purgeDeleted,
  findBatch,
  listBatches,
  publishBatch,
  storeBatchLines,
  type BatchDoc,
} from '../../domain/batches/store';
import { batchChunks } from '../../domain/batches/inputs';
import { resultTexts } from '../../domain/batches/results';
import type { PackedLines } from '../../domain/batches/packed-lines';
import { LiveCounts } from '../../domain/batches/live-counts';
import { PageCache } from '../../domain/batches/page-cache';
import { SettledBatches } from '../../domain/batches/settled-batches';
import { authOf } from '../auth';
import { requestMeta } from '../request-meta';
import { defineRoute, type AnyRoute } from '../route';
import { CursorPage, cursorPage } from '../../infrastructure/validation/types';
import {
  BatchIdParams,
  BatchObject,
  BatchQuery,
  CreateBatchBody,
  ListBatchesQuery,
  ResultsQuery,
  TERMINAL_STATUSES,
} from '../../domain/batches/schema';
import type { AppDeps } from '../deps';
import { admitBatchCreate, admitListPage, admitResultDownload, countResultBytes } from '../rate-limit';
import { closeUnread, mostBodyBytes } from '../body';
import { storedSize } from '../../domain/batches/packed-lines';
import { inPieces } from '../pieces';

const MAX_DATE_MS = 8.64e15;

const isTerminal = (s: string) => (TERMINAL_STATUSES as readonly string[]).includes(s);

/**
 * A strict bound from ISO 8601 or unix seconds, as a `created_at` filter. Unix seconds are compared
 * at the granularity the batch object shows: "after second S" starts at S + 1.
 */
function timeBound(name: 'created_after' | 'created_before', raw: string | undefined): Record<string, Date> {
  if (raw === undefined) return {};
  const seconds = /^\d+$/.test(raw);
  const ms = seconds ? Number(raw) * 1000 : Date.parse(raw);
  if (!Number.isFinite(ms)) throw new BadRequestError(`${name}: must be an ISO 8601 timestamp or unix seconds`);
  // Past ±8.64e15 ms a JavaScript Date is invalid, and a filter on it matched everything or nothing.
  if (Math.abs(ms) + 1000 > MAX_DATE_MS) throw new BadRequestError(`${name}: is outside the range of dates (years -271821 to 275760)`);
  if (name === 'created_after') return seconds ? { $gte: new Date(ms + 1000) } : { $gt: new Date(ms) };
  return { $lt: new Date(ms) };
}

/**
 * Result streams one workspace may have open at once in this process. A page of results costs one
 * or two reads, but a whole batch's results is a long stream: this keeps one workspace's downloads
 * from holding the database connections every other workspace's requests need.
 */
const MAX_RESULT_READS = 4;

/** A body larger than this (as declared; any body of unknown length) waits for the storage quota's check before it is read. */
const READ_FIRST_BYTES = 1024 ** 2;

export function batchRoutes({
  config,
  store,
  temporal,
  upstreams,
  metrics,
  batchBodies,
  bodyMemory,
  batchCreates,
  listPages,
  resultBytes,
  storage,
}: AppDeps): AnyRoute[] {
  const settings = config.batches;
  const resultReads = new Map<string, number>();
  const live = new LiveCounts(store);
  const pageCache = new PageCache();
  const settled = new SettledBatches();
  const runs = new BatchRuns(temporal, config, upstreams.catalog);

  /** Counts a result stream of the workspace as open (429 past MAX_RESULT_READS); the function returned ends it. */
  function claimResultRead(workspaceId: string): () => void {
    const open = resultReads.get(workspaceId) ?? 0;
    if (open >= MAX_RESULT_READS) {
      throw new RateLimitedError(
        `At most ${MAX_RESULT_READS} reads of batch results at once per workspace; retry when one has finished`,
        1,
      );
    }
    resultReads.set(workspaceId, open + 1);
    let ended = false;
    return () => {
      if (ended) return;
      ended = true;
      const left = resultReads.get(workspaceId)! - 1;
      if (left) resultReads.set(workspaceId, left);
      else resultReads.delete(workspaceId);
    };
  }

  /**
   * Starts a result download of the workspace: counted as open until it closes (read to the end,
   * failed, or the client went away; 429 past MAX_RESULT_READS), and refused once the workspace has
   * downloaded its RESULT_BYTES_PER_MINUTE. Before anything is read.
   */
  async function startResultRead(workspaceId: string): Promise<() => void> {
    const release = claimResultRead(workspaceId);
    try {
      await admitResultDownload(resultBytes, workspaceId);
    } catch (err) {
      release();
      throw err;
    }
    return release;
  }

  /** A result stream: its pieces counted as they are sent, its read released when it closes. */
  function resultStream(release: () => void, workspaceId: string, body: AsyncIterable<string>): Readable {
    // One piece ahead of the socket (Readable.from's default is 16, a megabyte of pieces a stream).
    const stream = Readable.from(countResultBytes(resultBytes, workspaceId, inPieces(body)), { highWaterMark: 1 });
    stream.once('close', release);
    return stream;
  }

  async function owned(id: string, workspaceId: string): Promise<BatchDoc> {
    const b = await findBatch(store, workspaceId, id);
    if (!b) throw new NotFoundError(`Batch ${id} not found`);
    return b;
  }

  /** The batch object; a terminal batch's results stream inline, never held in memory at once. */
  async function respondWithBatch(ctx: Parameters<AnyRoute['handler']>[0], b: BatchDoc, withResults = true): Promise<void> {
    const view = batchView(b, await live.of(b));
    if (!withResults || !isTerminal(b.status) || b.status === 'failed') {
      ctx.body = view;
      return;
    }
    const marker = `results-of-${b._id}`;
    const [head, tail] = JSON.stringify({ ...view, results: marker }).split(`"${marker}"`);
    ctx.body = resultStream(
      await startResultRead(b.workspace_id),
      b.workspace_id,
      (async function* () {
        yield `${head}[`;
        let first = true;
        for await (const r of resultTexts(store, b, {}, pageCache)) {
          yield `${first ? '' : ','}${r.text}`;
          first = false;
        }
        yield `]${tail}`;
      })(),
    );
    ctx.type = 'application/json';
  }

  /**
   * Starts a new batch's workflow. When the start fails, or does not answer within
   * `temporal.answerWithinMs`, the batch is given up: a start that reached Temporal all the same (its answer
   * lost, or late) then runs nothing.
   */
  async function startWorkflow(ctx: Parameters<AnyRoute['handler']>[0], doc: BatchDoc, modelId: string): Promise<void> {
    try {
      await runs.first(doc, modelId);
    } catch (err) {
      ctx.state.log.error({ err, batch_id: doc._id }, 'could not start batch workflow');
      // Unwritten, the workflow (if any) gives the batch up itself once it has waited for it.
      await abandonBatch(store, doc._id).catch(() => undefined);
      throw new ServiceUnavailableError('The batch could not be started, and nothing of it was kept; try again');
    }
  }

  /**
   * Starts a new batch's workflow and stores its lines, together: neither makes the batch visible,
   * and the one waits for a database, the other for Temporal. Then, both done, the document. A
   * start that fails gives the batch up (startWorkflow), and lines stored meanwhile are dropped.
   */
  async function startAndStore(
    ctx: Parameters<AnyRoute['handler']>[0],
    doc: BatchDoc,
    lines: PackedLines,
    modelId: string,
  ): Promise<BatchDoc> {
    const [started, stored] = await Promise.allSettled([
      startWorkflow(ctx, doc, modelId),
      storeBatchLines(store, doc, lines, settings.chunkSize, (...args) => batchBodies.writeInputs(...args)),
    ]);
    if (started.status === 'rejected') {
      // A store that failed has dropped what it wrote already.
      if (stored.status === 'fulfilled') await dropUnpublished(store, doc).catch(() => undefined);
      throw started.reason;
    }
    return publish(ctx, doc, stored);
  }

  /**
   * Stores a started batch's document, its lines stored. When either fails the batch is given up
   * and its lines dropped, so its workflow ends at once, running nothing; the client is told so.
   */
  async function publish(ctx: Parameters<AnyRoute['handler']>[0], doc: BatchDoc, lines: PromiseSettledResult<BatchDoc>): Promise<BatchDoc> {
    let stored: BatchDoc | null = null;
    try {
      if (lines.status === 'rejected') throw lines.reason;
      stored = lines.value;
      await publishBatch(store, stored);
      return stored;
    } catch (err) {
      ctx.state.log.error({ err, batch_id: doc._id }, 'could not store a started batch');
      if (!(err instanceof BatchAbandonedError)) {
        let published: BatchDoc | null;
        try {
          published = await abandonBatch(store, doc._id);
        } catch {
          // The database did not say. Lines stored, the document's insert may have gone through:
          // the lines stay, and the workflow gives the batch up (dropping them) if it did not.
          if (stored) {
            throw new ServiceUnavailableError(
              `The batch could not be stored, or it was and the answer was lost: if GET /api/v1/batches/${doc._id} finds it, it was created and will run`,
              { batch_id: doc._id },
            );
          }
          published = null;
        }
        if (published) return published; // its insert went through, only its answer was lost
      }
      await dropUnpublished(store, doc).catch(() => undefined);
      if (err instanceof BatchAbandonedError)
        throw new ServiceUnavailableError('The batch could not be stored in time, and will not run; try again');
      throw err;
    }
  }

  return [
    defineRoute({
      method: 'post',
      path: '/batches',
      tag: 'Batches',
      auth: 'any',
      billable: true,
      body: CreateBatchBody,
      readsOwnBody: true, // received by batchBodies: a large one to disk, then read off the event loop
      summary: 'Create a batch of requests to one endpoint, run asynchronously (202, status validating)',
      responses: { 202: { description: 'Accepted', schema: BatchObject } },
      handler: async (ctx) => {
        const auth = authOf(ctx);
        await admitBatchCreate(batchCreates, ctx, auth.workspaceId);
        // What the workspace stores, read while the body is (~1 ms of a create's ~20), and checked
        // before anything is started or stored. A workspace at its quota is refused before a large
        // body is read.
        const held = storage.stored(auth.workspaceId);
        held.catch(() => undefined); // awaited below, unless the create fails first
        if (mostBodyBytes(ctx.req, settings.maxBytes) > READ_FIRST_BYTES) {
          try {
            storage.check(await held, 1);
          } catch (err) {
            closeUnread(ctx);
            throw err;
          }
        }
        // The workflow is started and the lines are stored, and the document that makes the batch
        // visible comes last, so a visible batch always has a workflow to run it. The workflow
        // waits for the document; a batch that is given up instead (here, or by the workflow when
        // the document never comes) runs nothing and is never visible.
        // The lines are stored before the memory they take is given back.
        const { stored } = await batchBodies.receive(ctx, auth.workspaceId, bodyMemory, async (read) => {
          const { doc, lines, modelId } = await planNewBatch(
            { catalog: upstreams.catalog, allowPrivateCallbacks: config.webhooks.allowPrivateUrls },
            { workspaceId: auth.workspaceId, keyId: auth.keyId, meta: requestMeta(ctx) },
            read,
          );
          storage.check(await held, (doc.stored_bytes = storedSize(lines)));
          doc.chunks = batchChunks(lines, settings.chunkSize);
          return { stored: await startAndStore(ctx, doc, lines, modelId) };
        });
        await storage.add(auth.workspaceId, stored.stored_bytes ?? 0);
        metrics.batchesCreated.inc();
        ctx.status = 202;
        // The batch as accepted, which the interface answers as `validating`; its lines were checked
        // above, so the stored batch is in_progress already (or fails at once).
        ctx.body = batchView({ ...stored, status: 'validating', in_progress_at: null }, { completed: 0, failed: 0 });
      },
    }),
    defineRoute({
      method: 'get',
      path: '/batches',
      tag: 'Batches',
      auth: 'any',
      query: ListBatchesQuery,
      summary: "The workspace's batches, newest first (results never included)",
      responses: {
        200: {
          description: 'A page of batches',
          schema: CursorPage(BatchObject),
        },
      },
      handler: async (ctx, { query }) => {
        await admitListPage(listPages, authOf(ctx).workspaceId);
        const created = { ...timeBound('created_after', query.created_after), ...timeBound('created_before', query.created_before) };
        // A cursor must be a batch of this workspace (one read by _id): an unknown one would restart the list.
        if (query.after && !(await findBatch(store, authOf(ctx).workspaceId, query.after))) {
          throw new BadRequestError(`after: ${query.after} is not a batch of this workspace (use the last_id of a previous page)`);
        }
        const page = await listBatches(
          store,
          authOf(ctx).workspaceId,
          {
            after: query.after,
            statuses: query.status,
            created,
            limit: query.limit,
          },
          settled,
        );
        const items = page.slice(0, query.limit);
        // Every running item's counts in one read, not a few reads each.
        const counts = await live.ofEach(items);
        const data = items.map((b, i) => batchView(b, counts[i]));
        ctx.body = cursorPage(data, page.length > query.limit);
      },
    }),
    defineRoute({
      method: 'get',
      path: '/batches/:id',
      tag: 'Batches',
      auth: 'any',
      params: BatchIdParams,
      query: BatchQuery,
      summary: 'A batch with live counts; terminal batches include their results unless include_results=false',
      responses: { 200: { description: 'The batch', schema: BatchObject } },
      handler: async (ctx, { params, query }) =>
        respondWithBatch(ctx, await owned(params.id, authOf(ctx).workspaceId), query.include_results !== false),
    }),
    defineRoute({
      method: 'get',
      path: '/batches/:id/results',
      tag: 'Batches',
      auth: 'any',
      params: BatchIdParams,
      query: ResultsQuery,
      summary: 'Results so far as JSON Lines, in line order, streamed; page with after (a line number) and limit',
      responses: { 200: { description: 'One result per line', contentType: 'application/jsonl' } },
      handler: async (ctx, { params, query }) => {
        // Claimed before the batch is read: a refused reader costs the database nothing.
        const release = await startResultRead(authOf(ctx).workspaceId);
        let b: BatchDoc;
        try {
          b = await owned(params.id, authOf(ctx).workspaceId);
        } catch (err) {
          release();
          throw err;
        }
        ctx.body = resultStream(
          release,
          b.workspace_id,
          (async function* () {
            // Each text is a result object's JSON: the line number goes first, as `{"line":N,…}`.
            for await (const r of resultTexts(store, b, { after: query.after, limit: query.limit }, pageCache))
              yield `{"line":${r.line},${r.text.slice(1)}\n`;
          })(),
        );
        ctx.type = 'application/jsonl';
      },
    }),
    defineRoute({
      method: 'post',
      path: '/batches/:id/cancel',
      tag: 'Batches',
      auth: 'any',
      params: BatchIdParams,
      summary: 'Cancel a batch: in-flight calls are aborted, finished lines keep their results',
      responses: { 200: { description: 'The batch, cancelling', schema: BatchObject } },
      handler: async (ctx, { params }) => {
        const b = await owned(params.id, authOf(ctx).workspaceId);
        if (isTerminal(b.status)) throw new ConflictError(`Batch ${b._id} is already ${b.status}`);
        if ((await runs.cancel(b)) === 'ended') {
          const now = await owned(params.id, authOf(ctx).workspaceId); // closed by its run meanwhile
          if (isTerminal(now.status)) throw new ConflictError(`Batch ${b._id} is already ${now.status}`);
        }
        ctx.body = { ...batchView(b, await live.of(b)), status: 'cancelling' };
      },
    }),
    defineRoute({
      method: 'delete',
      path: '/batches/:id',
      tag: 'Batches',
      auth: 'any',
      params: BatchIdParams,
      summary: 'Delete a finished batch with its inputs and results (usage records are kept)',
      responses: {
        200: {
          description: 'Deleted',
          schema: Type.Object({ id: Type.String(), object: Type.Literal('batch.deleted'), deleted: Type.Literal(true) }),
        },
      },
      handler: async (ctx, { params }) => {
        const b = await owned(params.id, authOf(ctx).workspaceId);
        if (!isTerminal(b.status))
          throw new ConflictError(`Batch ${b._id} is ${b.status}; only completed, failed, expired or cancelled batches can be deleted`);
        if (await deleteBatch(store, b)) await storage.add(b.workspace_id, -(b.stored_bytes ?? 0));
        // Its lines go in the background; a deletion this process does not finish, another does (cli/roles).
        void purgeDeleted(store).catch((err) => ctx.state.log.warn({ err, batch_id: b._id }, 'batch lines not deleted yet'));
        ctx.body = { id: b._id, object: 'batch.deleted', deleted: true };
      },
    }),
  ];
}
