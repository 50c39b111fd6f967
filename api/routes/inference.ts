// POST /chat/completions, /messages, /responses and /embeddings: one call to a model, answered in
// the provider's own format, in one piece or streamed. The request names a model (and fallbacks), a
// preset, or both; the routing engine picks endpoints; what the call cost is recorded, durably,
// before the client is told the call is done.
import type Koa from 'koa';
import type { Endpoint } from '../../catalog';
import { GatewayError, UpstreamError } from '../../errors';
import { costOf } from '../../catalog/usd';
import type { Usage } from '../../providers/formats';
import { UpstreamFailure } from '../../providers/failure';
import { applyPreset, presetReference } from '../../presets/apply';
import { getPreset } from '../../presets/store';
import { failureToError } from '../../routing/execute';
import { newGenerationId, usageRecordOf, type UsageRecord } from '../../accounts/usage-ledger';
import type { RequestMeta } from '../../accounts/attribution';
import {
  finishBody,
  STREAM_FORMATS,
  StreamTally,
  type InferenceOperation,
  type Served,
  type StreamingOperation,
} from '../../inference/formats';
import { planInference, type InferencePlan } from '../../inference/request';
import { estimateCompletionCost, promptTokensEstimate } from '../../inference/estimate';
import { complete, openStream, type OpenedStream } from '../../inference/execute';
import {
  ChatCompletion,
  ChatCompletionRequest,
  Embeddings,
  EmbeddingsRequest,
  Message,
  MessagesRequest,
  Response,
  ResponsesRequest,
} from '../../schemas/inference';
import { authOf, type AuthContext } from '../auth';
import { EventStream } from '../event-stream';
import { requestMeta } from '../request-meta';
import { requestSignal } from '../request-signal';
import { defineRoute, type AnyRoute } from '../route';
import type { AppDeps } from '../deps';

type Body = Record<string, any>;

/** How often a stream journals what it has produced so far (the first time as soon as it has produced any). */
const CHECKPOINT_EVERY_MS = 1_000;

/** How a call ended, as its usage record keeps it. */
type Ending = 'completed' | 'client_closed' | 'upstream_failed';

interface Call {
  operation: InferenceOperation;
  plan: InferencePlan;
  auth: AuthContext;
  meta: RequestMeta;
  generationId: string;
  requestBytes: number;
  workspace: { only?: string[]; ignore?: string[] };
  signal: AbortSignal;
}

export function inferenceRoutes(deps: AppDeps): AnyRoute[] {
  const { store, upstreams, workspaces, usage, config } = deps;

  /** The usage record of a call. */
  const usageOf = (call: Call, endpoint: Endpoint, u: Usage, cost: number, details: Record<string, unknown>): UsageRecord =>
    usageRecordOf(
      { generationId: call.generationId, workspaceId: call.auth.workspaceId, keyId: call.auth.keyId, kind: 'completion', meta: call.meta },
      { model: endpoint.model.canonicalId, provider: endpoint.provider.slug, usage: u, cost },
      { operation: call.operation, ...details },
    );

  /** Records what the call cost; resolves once the record is durable. */
  const bill = (call: Call, endpoint: Endpoint, u: Usage, cost: number, details: Record<string, unknown>) =>
    usage.record(usageOf(call, endpoint, u, cost, details));

  async function answer(ctx: Koa.ParameterizedContext, call: Call): Promise<number> {
    const r = await complete(upstreams, call.operation, call.plan, call);
    const served: Served = { id: call.generationId, model: r.endpoint.model.canonicalId, provider: r.endpoint.provider.slug };
    await bill(call, r.endpoint, r.usage, r.cost, { stream: false, ending: 'completed', attempts: r.attempts.length + 1 });
    ctx.set('x-generation-id', call.generationId);
    ctx.body = finishBody(call.operation, r.body, served, r.usage, r.cost);
    return r.cost;
  }

  /** Streams the answer; resolves with what was billed once the stream is over, however it ended. */
  async function stream(ctx: Koa.ParameterizedContext, call: Call & { operation: StreamingOperation }): Promise<number> {
    const out = new EventStream(ctx, { 'x-generation-id': call.generationId }, config.inference.keepAliveMs);
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
    const served: Served = { id: call.generationId, model: endpoint.model.canonicalId, provider: endpoint.provider.slug };
    const relay = { includeUsage: call.plan.includeUsage, cost: (u: Usage) => costOf(endpoint, u) };
    /** The stream's last words wait until its usage is recorded. */
    const held: string[] = [];
    let failure: unknown = null;
    // What the stream has produced so far, journaled now and then: billed if this process dies mid-stream.
    const checkpoints = usage.checkpoints();
    let checkpointAt = -Infinity;
    const checkpoint = () => {
      const u = tally.usage(promptTokensEstimate(call.requestBytes));
      if (!u.output_tokens) return;
      const details = { stream: true, ending: 'gateway_stopped', attempts: opened.attempts.length + 1 };
      checkpoints!.save(usageOf(call, endpoint, u, costOf(endpoint, u), details));
      checkpointAt = performance.now();
    };
    try {
      for (let event = opened.first; ;) {
        const text = format.relay(event, served, tally, relay);
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
    const u = tally.usage(promptTokensEstimate(call.requestBytes));
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
      ctx.state.log.error({ err, generation_id: call.generationId }, 'usage record of a stream could not be written');
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
    if (ending === 'upstream_failed' || ending === 'client_closed') {
      ctx.state.log.info({ generation_id: call.generationId, ending, output_tokens: u.output_tokens }, 'stream ended early');
    }
    return billed ? cost : 0;
  }

  async function handle(ctx: Koa.ParameterizedContext, operation: InferenceOperation, given: Body): Promise<void> {
    const auth = authOf(ctx);
    const meta = requestMeta(ctx, given);
    const ref = presetReference(given);
    let body = given;
    if (ref) {
      const { designated_version: version } = await getPreset(store, auth.workspaceId, ref.slug);
      body = applyPreset(given, version, operation);
    }
    const plan = planInference(upstreams.catalog, body, operation);
    const requestBytes = ctx.request.length ?? Buffer.byteLength(JSON.stringify(given));
    const { settings } = await workspaces.get(auth.workspaceId);
    const { signal, done } = requestSignal(ctx, null);
    try {
      const call: Call = { operation, plan, auth, meta, generationId: newGenerationId(), requestBytes, workspace: settings, signal };
      await workspaces.billed(
        auth.workspaceId,
        estimateCompletionCost(plan.models, operation, requestBytes, plan.maxOutputTokens),
        signal,
        () => (plan.stream ? stream(ctx, call as Call & { operation: StreamingOperation }) : answer(ctx, call)),
      );
    } finally {
      done();
    }
  }

  const streamed = 'With `"stream": true`: server-sent events in this format\'s own grammar';
  return [
    defineRoute({
      method: 'post',
      path: '/chat/completions',
      tag: 'Inference',
      auth: 'any',
      billable: true,
      body: ChatCompletionRequest,
      summary: 'Chat completion (OpenAI Chat Completions shape), streamed or not',
      responses: { 200: { description: 'The completion', schema: ChatCompletion, stream: `${streamed}: data chunks, then data: [DONE]` } },
      handler: (ctx, { body }) => handle(ctx, 'chat', body),
    }),
    defineRoute({
      method: 'post',
      path: '/messages',
      tag: 'Inference',
      auth: 'any',
      billable: true,
      body: MessagesRequest,
      summary: 'Message (Anthropic Messages shape), streamed or not',
      responses: { 200: { description: 'The message', schema: Message, stream: `${streamed}: message_start … message_stop` } },
      handler: (ctx, { body }) => handle(ctx, 'messages', body),
    }),
    defineRoute({
      method: 'post',
      path: '/responses',
      tag: 'Inference',
      auth: 'any',
      billable: true,
      body: ResponsesRequest,
      summary: 'Response (OpenAI Responses shape), streamed or not',
      responses: { 200: { description: 'The response', schema: Response, stream: `${streamed}: response.created … response.completed` } },
      handler: (ctx, { body }) => handle(ctx, 'responses', body),
    }),
    defineRoute({
      method: 'post',
      path: '/embeddings',
      tag: 'Inference',
      auth: 'any',
      billable: true,
      body: EmbeddingsRequest,
      summary: 'Embeddings (OpenAI shape)',
      responses: { 200: { description: 'One embedding per input', schema: Embeddings } },
      handler: (ctx, { body }) => handle(ctx, 'embeddings', body),
    }),
  ];
}
