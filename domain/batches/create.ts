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
import { MAX_CHUNK_BYTES, newBatchId, type BatchDoc, type InputLine } from './store';

export interface NewBatch {
  doc: BatchDoc;
  lines: InputLine[];
  /** The catalog id of the batch's model (a search attribute of its workflow). */
  modelId: string;
}

export async function planNewBatch(
  deps: { catalog: Catalog; maxRequests: number; allowPrivateCallbacks: boolean },
  who: { workspaceId: string; keyId: string; meta: RequestMeta },
  body: Static<typeof CreateBatchBody>,
  now = new Date(),
): Promise<NewBatch> {
  if (body.requests.length > deps.maxRequests) {
    throw new PayloadTooLargeError(`requests: ${body.requests.length} lines, more than the limit of ${deps.maxRequests}`);
  }
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
  checkLines(deps.catalog, body, model);

  const id = newBatchId(now.getTime());
  const completionWindow = body.completion_window ?? '24h';
  // Each body checked against the endpoint's shape now, while it is parsed (a few µs a line). The
  // workflow is handed the result (workflows/batch.ts): a batch whose lines are all valid is stored
  // in_progress and runs its chunks at once, one Temporal round trip fewer than a validation step.
  const validation: LineCheck = { invalid: 0, examples: [] };
  const lines = body.requests.map((r, line) => {
    const text = toJsonText(r.body);
    if (text.length > MAX_CHUNK_BYTES) {
      throw new PayloadTooLargeError(`requests[${line}].body: larger than ${MAX_CHUNK_BYTES / 1024 ** 2} MB (custom_id "${r.custom_id}")`);
    }
    checkLine(body.endpoint, r.custom_id, r.body, validation);
    return { line, custom_id: r.custom_id, body: text };
  });
  const valid = validation.invalid === 0;
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
    total: body.requests.length,
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
  return { doc, lines, modelId: model.id };
}

/** Unique custom_ids, and no line naming another model than the batch's (a preset may stand for it). */
function checkLines(catalog: Catalog, body: Static<typeof CreateBatchBody>, model: ReturnType<Catalog['resolve']>['model']): void {
  const seen = new Map<string, number>();
  body.requests.forEach((r, i) => {
    const prior = seen.get(r.custom_id);
    if (prior !== undefined) {
      throw new UnprocessableError(`requests[${i}].custom_id: duplicate custom_id "${r.custom_id}" (also at requests[${prior}])`, {
        custom_id: r.custom_id,
      });
    }
    seen.set(r.custom_id, i);
    const own = r.body.model;
    if (own === undefined || own === body.model || (typeof own === 'string' && own.includes('preset/'))) return;
    let same = false;
    try {
      same = typeof own === 'string' && catalog.resolve(own).model === model;
    } catch {
      /* unknown model: not the same */
    }
    if (!same)
      throw new BadRequestError(`requests[${i}].body.model: must match the batch model ${body.model} (custom_id "${r.custom_id}")`);
  });
}
