// What creating a batch decides before anything is stored: the limits, the model and its route, the
// callback URL, each line's custom_id and model, and the batch document itself. Every refusal is
// a 4xx naming the line; nothing here writes.
import type { Static } from '@sinclair/typebox';
import type { Catalog } from '../catalog';
import type { RequestMeta } from '../accounts/attribution';
import { BadRequestError, PayloadTooLargeError, UnprocessableError } from '../../infrastructure/errors';
import { planRoute } from '../routing/engine';
import type { CreateBatchBody } from './schema';
import { toJsonText } from '../../infrastructure/store/json-text';
import { checkCallbackUrl } from '../webhooks/address';
import { checkLine, OPERATION_OF, type LineCheck } from './lines';
import { MAX_LINE_BYTES } from './inputs';
import { newBatchId, type BatchDoc } from './store';
import { bodyBytes, lineCount, packLines, type PackedLines } from './packed-lines';

export interface NewBatch {
  doc: BatchDoc;
  lines: PackedLines;
  /** The catalog id of the batch's model (a search attribute of its workflow). */
  modelId: string;
}

type CreateBody = Static<typeof CreateBatchBody>;

/** A batch create body with its lines read: checked, their bodies packed as JSON text. */
export interface ReadBatch {
  fields: Omit<CreateBody, 'requests'>;
  lines: PackedLines;
  /** Lines whose body does not suit the endpoint (the workflow fails the batch for them). */
  validation: LineCheck;
  /** Each model a line names other than the batch's (not a preset), at the first line naming it: the catalog decides if it is the same. */
  lineModels: { model: string; line: number; custom_id: string }[];
}

/**
 * Reads the lines of a batch create body: the line limit, unique custom_ids, each body's size and
 * shape, and its JSON text. CPU alone, with no catalog or database, so that a large batch is read
 * on a worker thread (api/batch-body.ts).
 */
export function readBatchLines(body: CreateBody, maxRequests: number): ReadBatch {
  const { requests, ...fields } = body;
  if (requests.length > maxRequests) {
    throw new PayloadTooLargeError(`requests: ${requests.length} lines, more than the limit of ${maxRequests}`);
  }
  const seen = new Map<string, number>();
  const models = new Map<string, ReadBatch['lineModels'][number]>();
  // Each body checked against the endpoint's shape now, while it is parsed (a few µs a line). The
  // workflow is handed the result (workflows/batch.ts): a batch whose lines are all valid is stored
  // in_progress and runs its chunks at once, one Temporal round trip fewer than a validation step.
  const validation: LineCheck = { invalid: 0, examples: [] };
  const texts = requests.map((r, line) => {
    const prior = seen.get(r.custom_id);
    if (prior !== undefined) {
      throw new UnprocessableError(`requests[${line}].custom_id: duplicate custom_id "${r.custom_id}" (also at requests[${prior}])`, {
        custom_id: r.custom_id,
      });
    }
    seen.set(r.custom_id, line);
    const own = r.body.model;
    if (own !== undefined && own !== body.model && !(typeof own === 'string' && own.includes('preset/'))) {
      if (typeof own !== 'string') throw lineModelError(body.model, line, r.custom_id);
      if (!models.has(own)) models.set(own, { model: own, line, custom_id: r.custom_id });
    }
    checkLine(body.endpoint, r.custom_id, r.body, validation);
    return { custom_id: r.custom_id, body: toJsonText(r.body) };
  });
  const lines = packLines(texts);
  // In bytes, as stored: a chunk of one line must still fit in a document.
  for (let line = 0; line < texts.length; line++) {
    if (bodyBytes(lines, line) > MAX_LINE_BYTES) {
      const customId = texts[line].custom_id;
      throw new PayloadTooLargeError(`requests[${line}].body: larger than ${MAX_LINE_BYTES / 1024 ** 2} MB (custom_id "${customId}")`);
    }
  }
  return { fields, lines, validation, lineModels: [...models.values()] };
}

const lineModelError = (batchModel: string, line: number, customId: string) =>
  new BadRequestError(`requests[${line}].body.model: must match the batch model ${batchModel} (custom_id "${customId}")`);

export async function planNewBatch(
  deps: { catalog: Catalog; allowPrivateCallbacks: boolean },
  who: { workspaceId: string; keyId: string; meta: RequestMeta },
  read: ReadBatch,
  now = new Date(),
): Promise<NewBatch> {
  const body = read.fields;
  const { model, variant } = deps.catalog.resolve(body.model);
  const callbackUrl = body.callback_url ? (await checkCallbackUrl(body.callback_url, deps.allowPrivateCallbacks)).href : null;
  // 404 now, naming what excluded every endpoint, rather than a failed batch later.
  planRoute({
    models: [model],
    variant,
    operation: OPERATION_OF[body.endpoint],
    preferences: body.provider?.only ? { only: body.provider.only } : undefined,
    now: now.getTime(),
    random: Math.random,
  });
  // A line may name the batch's model another way (an alias, a dated id); no other model.
  for (const l of read.lineModels) {
    let same = false;
    try {
      same = deps.catalog.resolve(l.model).model === model;
    } catch {
      /* unknown model: not the same */
    }
    if (!same) throw lineModelError(body.model, l.line, l.custom_id);
  }

  const id = newBatchId(now.getTime());
  const completionWindow = body.completion_window ?? '24h';
  const { validation } = read;
  const valid = validation.invalid === 0;
  const total = lineCount(read.lines);
  const doc: BatchDoc = {
    _id: id,
    workspace_id: who.workspaceId,
    key_id: who.keyId,
    endpoint: body.endpoint,
    model: body.model,
    canonical_model: model.canonicalId,
    completion_window: completionWindow,
    status: valid ? 'in_progress' : 'validating',
    created_at: now,
    in_progress_at: valid ? now : null,
    finalized_at: null,
    expires_at: new Date(now.getTime() + Number(completionWindow.slice(0, -1)) * 3_600_000),
    provider_only: body.provider?.only ?? null,
    total,
    chunks: 0,
    chunk_starts: [],
    provider: null,
    usage: null,
    error: null,
    metadata: body.metadata ? toJsonText(body.metadata) : null,
    callback_url: callbackUrl,
    meta: { session_id: who.meta.session_id, user: who.meta.user, app: who.meta.app },
    validation,
  };
  return { doc, lines: read.lines, modelId: model.id };
}
