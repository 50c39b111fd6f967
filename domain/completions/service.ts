// Completions as a service: one call to a model (chat, messages, responses, embeddings), answered
// in one piece or streamed. It owns the capability's rules once: the preset applied, the plan
// (models, routing, the body the provider gets), spend admitted before the call, and the usage
// recorded, durably, before the client is told the call is done (a stream's closing events wait
// for it). The HTTP layer parses and renders; a stream is written to whatever sink it passes.
import type { KeptVersions } from '../presets/kept-versions';
import type { Endpoint } from '../catalog';
import { costOf } from '../catalog/usd';
import { GatewayError, UpstreamError } from '../../infrastructure/errors';
import type { Logger } from '../../infrastructure/log';
import type { Store } from '../../infrastructure/store';
import type { Usage } from '../../infrastructure/providers/formats';
import { UpstreamFailure } from '../../infrastructure/providers/failure';
import { presetLookup, withPreset } from '../presets/apply';
import { failureToError } from '../routing/execute';
import { sessionKey, type Upstreams } from '../routing/upstreams';
import type { Broadcaster } from '../traces/broadcast';
import { finishReasonOf } from '../traces/span';
import { newGenerationId, usageRecordOf, type UsageLedger, type UsageRecord } from '../accounts/usage-ledger';
import type { RequestMeta } from '../accounts/attribution';
import type { SpendAdmission } from '../accounts/spend-admission';
import { finishBody, STREAM_FORMATS, StreamTally, type InferenceOperation, type Served, type StreamingOperation } from './formats';
import { planInference, type InferencePlan } from './request';
import { estimateCompletionCost, promptSizeOf, promptTokensEstimate, type PromptSize } from './estimate';
import { complete, openStream, type OpenedStream } from './execute';
import { countedFromRequest, withCounted } from './counted-from-request';

type Body = Record<string, any>;

/** Names the parameters the serving provider's format could not take (dropped, as `require_parameters` allows), and the plugins not run. */
export const DROPPED_HEADER = 'x-gateway-dropped-params';

/** How often a stream journals what it has produced so far (the first time as soon as it has produced any). */
const CHECKPOINT_EVERY_MS = 1_000;

/** How a call ended, as its usage record keeps it. */
type Ending = 'completed' | 'client_closed' | 'upstream_failed';

/** Where a stream's events go (the HTTP layer's server-sent-events answer). */
export interface EventSink {
  /** Whether anything went out: after that, an error can only be told as an event. */
  readonly started: boolean;
  /** A header for the answer, when it has not started. */
  setHeader(name: string, value: string): void;
  write(text: string): Promise<void>;
  end(): void;
}

export interface CompletionRequest {
  operation: InferenceOperation;
  body: Body;
  workspaceId: string;
  keyId: string;
  meta: RequestMeta;
  /** The request's size, for estimates of its prompt tokens. */
  requestBytes: number;
  signal: AbortSignal;
  log: Logger;
}

/** A request made ready to run: its preset applied, its plan made, its generation id given. */
export interface Call extends CompletionRequest {
  /** What its preset added to the prompt (its config and system prompt), 0 without one. */
  presetChars: number;
  /** What estimates of its prompt tokens rest on: the request's size and its preset's, and the media it names. */
  prompt: Required<PromptSize>;
  plan: InferencePlan;
  generationId: string;
  workspace: { only?: string[]; ignore?: string[] };
  session: string | undefined;
}

export interface CompletionDeps {
  store: Store;
  upstreams: Upstreams;
  workspaces: SpendAdmission;
  usage: UsageLedger;
  /** Where each call's generation is sent as a span (trace broadcast). */
  broadcast?: Pick<Broadcaster, 'generation'>;
  /** Preset versions this process has read. */
  presetVersions?: KeptVersions;
}

export function completionService({ store, upstreams, workspaces, usage, broadcast, presetVersions }: CompletionDeps) {
  /** The call's generation, for the trace destinations. */
  const broadcastCall = (
    call: Call,
    endpoint: Endpoint,
    u: Usage,
    cost: number,
    at: { startedAt: number; finishReason: string | null; output: unknown; error?: string | null },
  ) =>
    broadcast?.generation({
      workspaceId: call.workspaceId,
      id: call.generationId,
      api: call.operation,
      kind: 'completion',
      requestedModel: call.plan.models[0].id, // the model asked for, a preset's included
      model: endpoint.model.canonicalId,
      provider: endpoint.provider.slug,
      usage: u,
      cost,
      finishReason: at.finishReason,
      startedAt: at.startedAt,
      endedAt: Date.now(),
      meta: call.meta,
      error: at.error ?? null,
      content: () => ({ input: call.plan.upstreamBody, output: at.output }),
    });

  const recordOf = (call: Call, endpoint: Endpoint, u: Usage, cost: number, details: Record<string, unknown>): UsageRecord =>
    usageRecordOf(
      { generationId: call.generationId, workspaceId: call.workspaceId, keyId: call.keyId, kind: 'completion', meta: call.meta },
      { model: endpoint.model.canonicalId, provider: endpoint.provider.slug, usage: u, cost },
      { operation: call.operation, ...details },
    );

  /** Records what the call cost; resolves once the record is durable. */
  const bill = (call: Call, endpoint: Endpoint, u: Usage, cost: number, details: Record<string, unknown>) =>
    usage.record(recordOf(call, endpoint, u, cost, details));

  /** Runs `work` with what the call may cost held against the workspace's credit, billed what it returns. */
  const admitted = (call: Call, work: () => Promise<number>) =>
    workspaces.billed(
      call.workspaceId,
      estimateCompletionCost(call.plan.models, call.operation, call.prompt, call.plan.maxOutputTokens, call.plan.choices, call.plan.extras),
      call.signal,
      work,
    );

  async function prepare(req: CompletionRequest): Promise<Call> {
    const { body, addedChars } = await withPreset(req.body, req.operation, presetLookup(store, req.workspaceId, presetVersions));
    const plan = planInference(upstreams.catalog, body, req.operation);
    const settings = await workspaces.settings(req.workspaceId);
    // Field by field, not `{ ...req, … }`: on Node 20 a spread followed by more fields costs ~1.5 µs
    // a field (9 µs here, 2.8% of a proxied call's CPU); listed, 0.2 µs.
    return {
      operation: req.operation,
      body: req.body,
      workspaceId: req.workspaceId,
      keyId: req.keyId,
      meta: req.meta,
      requestBytes: req.requestBytes,
      signal: req.signal,
      log: req.log,
      presetChars: addedChars,
      prompt: promptSizeOf(plan.upstreamBody, req.requestBytes + addedChars),
      plan,
      generationId: newGenerationId(),
      workspace: settings,
      session: sessionKey(req.workspaceId, req.meta.session_id),
    };
  }

  /** The answer in one piece, in the call's own format, once its usage is recorded; and the parameters dropped. */
  async function answer(call: Call): Promise<{ body: Body; dropped: string[] }> {
    let out = { body: {} as Body, dropped: [] as string[] };
    const startedAt = Date.now();
    await admitted(call, async () => {
      const r = await complete(upstreams, call.operation, call.plan, call);
      const served: Served = { id: call.generationId, model: r.endpoint.model.canonicalId, provider: r.endpoint.provider.slug };
      await bill(call, r.endpoint, r.usage, r.cost, { stream: false, ending: 'completed', attempts: r.attempts.length + 1 });
      out = { body: finishBody(call.operation, r.body, served, r.usage, r.cost), dropped: [...r.dropped, ...call.plan.notRun] };
      broadcastCall(call, r.endpoint, r.usage, r.cost, { startedAt, finishReason: finishReasonOf(r.body), output: r.body });
      return r.cost;
    });
    return out;
  }

  /** Streams the answer to the sink `open` gives once the call is admitted; resolves when it is over, however it ended. */
  async function stream(call: Call, open: () => EventSink): Promise<void> {
    await admitted(call, () => relay(call as Call & { operation: StreamingOperation }, open()));
  }

  /** Relays the stream; resolves with what was billed. */
  async function relay(call: Call & { operation: StreamingOperation }, out: EventSink): Promise<number> {
    const startedAt = Date.now();
    const format = STREAM_FORMATS[call.operation];
    const tally = new StreamTally();
    let opened: OpenedStream;
    try {
      opened = await openStream(upstreams, call.operation, call.plan, call);
    } catch (err) {
      // Every endpoint failed before the first event. Unless keep-alives already started the
      // answer, that is an ordinary error response.
      if (!out.started) {
        out.end();
        throw err;
      }
      const g = err instanceof GatewayError ? err : new UpstreamError('Provider error');
      const provider = (g.metadata?.provider_name as string | undefined) ?? null;
      await out.write(format.error(g, { id: call.generationId, model: call.plan.models[0].canonicalId, provider }, tally));
      out.end();
      return 0;
    }

    const { endpoint } = opened;
    // What the request counts is billed however the stream ends, and is in the cost the client is shown.
    const counted = countedFromRequest(call.operation, call.plan.upstreamBody, opened.dropped);
    tally.counted = counted;
    tally.audioAsked = call.plan.extras.audioOut;
    const dropped = [...opened.dropped, ...call.plan.notRun];
    if (dropped.length) out.setHeader(DROPPED_HEADER, dropped.sort().join(','));
    const served: Served = { id: call.generationId, model: endpoint.model.canonicalId, provider: endpoint.provider.slug };
    const options = { includeUsage: call.plan.includeUsage, cost: (u: Usage) => costOf(endpoint, withCounted(u, counted)) };
    /** The stream's last words wait until its usage is recorded. */
    const held: string[] = [];
    let failure: unknown = null;
    // What the stream has produced so far, journaled now and then: billed if this process dies mid-stream.
    const checkpoints = usage.checkpoints();
    let checkpointAt = -Infinity;
    const checkpoint = () => {
      const u = tally.usage(promptTokensEstimate(call.prompt, endpoint.model.context_length));
      if (!u.output_tokens) return;
      const details = { stream: true, ending: 'gateway_stopped', attempts: opened.attempts.length + 1 };
      checkpoints!.save(recordOf(call, endpoint, u, costOf(endpoint, u), details));
      checkpointAt = performance.now();
    };
    try {
      for (let event = opened.first; ;) {
        const text = format.relay(event, served, tally, options);
        if (text !== null) {
          if (tally.finished) held.push(text);
          else await out.write(text);
        }
        if (checkpoints && !tally.finished && performance.now() - checkpointAt >= CHECKPOINT_EVERY_MS) checkpoint();
        const next = await opened.events.next();
        if (next.done) break;
        event = next.value;
      }
    } catch (err) {
      failure = err;
    } finally {
      opened.release();
    }

    const ending: Ending = call.signal.aborted ? 'client_closed' : tally.finished && !tally.upstreamError ? 'completed' : 'upstream_failed';
    const u = tally.usage(promptTokensEstimate(call.prompt, endpoint.model.context_length));
    const cost = costOf(endpoint, u);
    upstreams.stats.record(endpoint.key, {
      ok: ending !== 'upstream_failed',
      latencyMs: performance.now() - opened.startedAt,
      outputTokens: u.output_tokens,
    });
    let billed = true;
    try {
      await bill(call, endpoint, u, cost, { stream: true, ending, attempts: opened.attempts.length + 1 });
      checkpoints?.end();
    } catch (err) {
      billed = false;
      call.log.error({ err, generation_id: call.generationId }, 'usage record of a stream could not be written');
    }
    if (ending === 'upstream_failed' && !tally.upstreamError) {
      // The provider went away mid-stream (or ended without its closing event): too late to fall back.
      const f =
        failure === null
          ? new UpstreamFailure('invalid_response', endpoint.provider.slug, 'Provider ended the stream before finishing it')
          : upstreams.http.classify(failure, endpoint.provider.slug, endpoint.provider.timeout_ms);
      await out.write(format.error(failureToError(f, [...opened.attempts]), served, tally));
    } else if (!billed) {
      await out.write(format.error(new UpstreamError('The call finished but its usage could not be recorded'), served, tally));
    } else {
      for (const text of held) await out.write(text);
    }
    out.end();
    // A stream's answer is not kept (it went to the client event by event): its span carries the prompt only.
    broadcastCall(call, endpoint, u, cost, { startedAt, finishReason: null, output: null, error: ending === 'completed' ? null : ending });
    if (ending === 'upstream_failed' || ending === 'client_closed') {
      call.log.info({ generation_id: call.generationId, ending, output_tokens: u.output_tokens }, 'stream ended early');
    }
    return billed ? cost : 0;
  }

  return { prepare, answer, stream };
}
