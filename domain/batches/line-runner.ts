// One batch line, start to result: its preset applied, then the upstream call with this line's
// retry policy. Routing already falls back across endpoints within one attempt; this layer only
// decides whether a whole failed attempt is worth repeating (and waits out a provider that is
// down), and never throws for an upstream failure: a failed line is a result, not a failed chunk.
import type { KeptVersions } from '../presets/kept-versions';
import { errorTypeOf, GatewayError, PaymentRequiredError, RateLimitedError } from '../../infrastructure/errors';
import type { Hold, SpendAdmission } from '../accounts/spend-admission';
import { estimateCompletionCost, promptSizeOf } from '../completions/estimate';
import { invoke, sessionKey, type Upstreams } from '../routing/upstreams';
import type { Broadcaster } from '../traces/broadcast';
import { finishReasonOf } from '../traces/span';
import { presetLookup, withPreset, type PresetLookup } from '../presets/apply';
import { billedRequest, upstreamBodyOf } from '../completions/request';
import type { PricedExtras } from '../routing/engine';
import type { ProviderPreferences } from '../routing/preferences';
import type { Store } from '../../infrastructure/store';
import { OPERATION_OF } from './lines';
import { failedResult, lineGenerationId, type ResultDoc } from './results';
import { lineBody, type InputLine } from './inputs';
import { seqId } from './placement';
import { type BatchDoc } from './store';
import { sleep } from '../../infrastructure/concurrency/sleep';
import { withFields } from '../../infrastructure/objects/with-fields';

const RETRYABLE = new Set([429, 502, 503, 524, 529]);

/** True when every endpoint tried could not even be connected to. */
function unreachable(err: GatewayError | null): boolean {
  const attempts = err?.metadata?.attempts as { kind: string }[] | undefined;
  return !!attempts?.length && attempts.every((a) => a.kind === 'connection');
}

export interface LineRunnerOptions {
  store: Store;
  upstreams: Upstreams;
  batch: BatchDoc;
  /** The workspace's routing settings. */
  workspace: { only?: string[]; ignore?: string[] } | undefined;
  /** Spend admission: every line holds its estimate before it is sent, as a synchronous call does. */
  credits: Pick<SpendAdmission, 'hold'>;
  lineAttempts: number;
  /** How long a provider refusing connections is waited out. */
  outageMs: number;
  /** Where each line's generation is sent as a span (trace broadcast). */
  broadcast?: Pick<Broadcaster, 'generation'>;
  /** Preset versions this process has read. */
  presetVersions?: KeptVersions;
}

/** A line's result; `stored` is to be called once its usage record is in the ledger (billed lines only). */
export interface LineOutcome {
  result: ResultDoc;
  stored?: () => void;
}

/** How long a chunk keeps a preset it read before it reads it again. */
const PRESET_RECHECK_MS = 5_000;

export class LineRunner {
  private readonly operation;
  private readonly target;
  /** Each preset is read at most once per PRESET_RECHECK_MS per chunk, however many lines name it. */
  private readonly preset: PresetLookup;
  /** The batch's routing preferences: its lines' own are not read. */
  private readonly preferences: ProviderPreferences | undefined;

  constructor(private readonly o: LineRunnerOptions) {
    this.operation = OPERATION_OF[o.batch.endpoint];
    this.target = o.upstreams.catalog.resolve(o.batch.model);
    this.preferences = o.batch.provider_only ? { only: o.batch.provider_only } : undefined;
    const read = presetLookup(o.store, o.batch.workspace_id, o.presetVersions);
    const seen = new Map<string, { reading: ReturnType<PresetLookup>; at: number }>();
    this.preset = (slug) => {
      const known = seen.get(slug);
      // Read again now and then: a chunk runs for minutes, and a preset deleted (or given a new
      // version) meanwhile applies to its later lines as it does to calls.
      if (!known || Date.now() - known.at >= PRESET_RECHECK_MS) {
        const entry = { reading: read(slug), at: Date.now() };
        // A database error is forgotten, so the next line asks again; a missing preset is remembered.
        entry.reading.catch((err) => {
          if ((!(err instanceof GatewayError) || err.status >= 500) && seen.get(slug) === entry) seen.delete(slug);
        });
        seen.set(slug, entry);
      }
      return seen.get(slug)!.reading;
    };
  }

  private failure(line: InputLine, status: number, message: string, provider: string | null = null): ResultDoc {
    return failedResult(this.o.batch._id, line, { type: errorTypeOf(status), message, code: status }, provider);
  }

  /** Runs a line; `signal` stops it (its waits, its upstream call), thrown as the signal's reason. */
  async run(line: InputLine, signal: AbortSignal): Promise<LineOutcome> {
    let body: Record<string, unknown>;
    let presetChars: number;
    let extras: PricedExtras;
    try {
      ({ body, addedChars: presetChars } = await withPreset(lineBody(line), this.operation, this.preset));
      ({ body, extras } = billedRequest([this.target.model], body, this.operation, {
        variant: this.target.variant,
        preferences: this.preferences,
      }));
    } catch (err) {
      // A preset that is missing (or another workspace's), or what a provider would bill beyond the
      // catalog's prices, fails this line alone, never the chunk.
      if (err instanceof GatewayError && err.status < 500) return { result: this.failure(line, err.status, err.message) };
      throw err;
    }
    // The gateway's own fields (routing, presets, attribution, streaming) never reach the provider.
    const upstreamBody = upstreamBodyOf(body);
    const { batch } = this.o;
    let hold: Hold;
    try {
      // A line has no client waiting on it: it waits for credit held by other lines as long as it takes.
      hold = await this.o.credits.hold(batch.workspace_id, this.estimate(line, body, presetChars, extras), signal, Infinity);
    } catch (err) {
      signal.throwIfAborted(); // the chunk was cancelled: the activity reports that
      // Credit ran out: this line is not sent, and says why; later lines are admitted again once credits are added.
      if (err instanceof PaymentRequiredError) return { result: this.failure(line, 402, err.message) };
      throw err;
    }
    try {
      // A line's own session id, else the session of the request that created the batch.
      const sessionId = typeof body.session_id === 'string' && body.session_id ? body.session_id : batch.meta.session_id;
      const startedAt = Date.now();
      const result = await this.call(line, upstreamBody, extras, sessionKey(batch.workspace_id, sessionId), signal);
      this.broadcast(body, sessionId, result, startedAt);
      if (!result.ok || !result.usage) return { result };
      return { result, stored: hold.settleUnstored(result.usage.cost) };
    } finally {
      hold.release(); // no-op once settled
    }
  }

  /** The line's generation as a span for the trace destinations (a line the provider answered, or failed). */
  private broadcast(body: Record<string, unknown>, sessionId: string | null, result: ResultDoc, startedAt: number): void {
    const { batch } = this.o;
    const answer = result.response?.body;
    this.o.broadcast?.generation({
      workspaceId: batch.workspace_id,
      id: result.id,
      api: this.operation,
      kind: 'batch_line',
      requestedModel: batch.model,
      model: this.target.model.canonicalId,
      provider: result.provider,
      usage: result.usage ?? { input_tokens: 0, output_tokens: 0 },
      cost: result.usage?.cost ?? 0,
      finishReason: finishReasonOf(answer),
      startedAt,
      endedAt: Date.now(),
      meta: {
        session_id: sessionId,
        user: batch.meta.user,
        trace: (body.trace as Record<string, unknown>) ?? null,
      },
      batchId: batch._id,
      error: result.error?.message ?? null,
      content: () => ({ input: upstreamBodyOf(body), output: answer ?? null }),
    });
  }

  /** What the line may cost, as a synchronous call of the same body would hold: its preset's prompt included. */
  private estimate(line: InputLine, body: Record<string, unknown>, presetChars: number, extras: PricedExtras): number {
    const cap = body.max_completion_tokens ?? body.max_tokens ?? body.max_output_tokens;
    return estimateCompletionCost(
      [this.target.model],
      this.operation,
      promptSizeOf(body, Buffer.byteLength(line.body) + presetChars),
      Number.isInteger(cap) ? (cap as number) : null,
      1,
      extras,
    );
  }

  private async call(
    line: InputLine,
    upstreamBody: Record<string, unknown>,
    extras: PricedExtras,
    session: string | undefined,
    signal: AbortSignal,
  ): Promise<ResultDoc> {
    const { batch } = this.o;
    const id = lineGenerationId(batch._id, line.line);
    let unreachableSince: number | null = null;
    for (let attempt = 1; ; attempt++) {
      try {
        const r = await invoke(this.o.upstreams, {
          workspaceId: batch.workspace_id,
          models: [this.target.model],
          variant: this.target.variant,
          extras,
          operation: this.operation,
          preferences: this.preferences,
          workspace: this.o.workspace,
          session,
          body: upstreamBody,
          signal,
        });
        return {
          _id: seqId(line.line),
          line: line.line,
          custom_id: line.custom_id,
          id,
          ok: true,
          provider: r.endpoint.provider.slug,
          response: { status_code: 200, request_id: typeof r.body?.id === 'string' ? r.body.id : id, body: r.body },
          error: null,
          usage: withFields(r.usage, { cost: r.cost }),
        };
      } catch (err) {
        signal.throwIfAborted(); // the chunk was cancelled: the activity reports that
        const g = err instanceof GatewayError ? err : null;
        const status = g?.status ?? 500;
        // A provider that refuses connections is down, not failing this line: wait it out
        // (within the outage allowance) without spending the line's attempts.
        if (unreachable(g)) {
          unreachableSince ??= Date.now();
          if (Date.now() - unreachableSince < this.o.outageMs) {
            attempt--;
            await sleep(1000, signal);
            continue;
          }
        }
        if (g && RETRYABLE.has(status) && attempt < this.o.lineAttempts) {
          const wait = err instanceof RateLimitedError ? err.retryAfterSeconds * 1000 : 500 * 2 ** (attempt - 1);
          await sleep(Math.min(wait, 30_000), signal);
          continue;
        }
        return this.failure(
          line,
          status,
          g?.message ?? 'Internal error processing this line',
          (g?.metadata?.provider_name as string | undefined) ?? null,
        );
      }
    }
  }
}
