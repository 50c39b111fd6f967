// Calls a provider for an inference request through the routing engine: `complete` for an answer
// in one piece, `openStream` for a stream. A stream counts as started at its first event: until
// then any failure (refused, an error status, an error event, an empty stream) falls back to the
// next endpoint; after it, nothing does, and the stream's own end says how it went.
import type { EventSourceMessage } from 'eventsource-parser';
import type { Endpoint } from '../catalog';
import { openEndpointStream, streamErrorOf } from '../routing/endpoint-call';
import type { StreamTranslator } from '../../infrastructure/providers/translate';
import { UpstreamFailure } from '../../infrastructure/providers/failure';
import { optionsFor } from '../routing/engine';
import { executePlan, type Attempt } from '../routing/execute';
import { invoke, routeFor, type Invocation, type InvokeRequest, type Upstreams } from '../routing/upstreams';
import type { InferenceOperation, StreamingOperation } from './formats';
import type { InferencePlan } from './request';
import { sseEvents } from './sse';
import { withFields } from '../../infrastructure/objects/with-fields';

export interface CallContext {
  workspaceId: string;
  workspace: { only?: string[]; ignore?: string[] } | undefined;
  signal: AbortSignal;
  /** The sticky-routing key, when the call names a session. */
  session?: string;
}

function requestOf(operation: InferenceOperation, plan: InferencePlan, ctx: CallContext): InvokeRequest {
  return {
    workspaceId: ctx.workspaceId,
    models: plan.models,
    variant: plan.variant,
    extras: plan.extras,
    operation,
    preferences: plan.preferences,
    workspace: ctx.workspace,
    parameters: plan.parameters,
    session: ctx.session,
    body: plan.upstreamBody,
    signal: ctx.signal,
  };
}

export function complete(up: Upstreams, operation: InferenceOperation, plan: InferencePlan, ctx: CallContext): Promise<Invocation> {
  return invoke(up, requestOf(operation, plan, ctx));
}

export interface OpenedStream {
  endpoint: Endpoint;
  /** The first event, already read; then the rest (in the caller's format, translated if need be). */
  first: EventSourceMessage;
  events: AsyncGenerator<EventSourceMessage>;
  /** Parameters the provider's format could not take. */
  dropped: string[];
  attempts: Attempt[];
  /** When the call was made (performance.now()). */
  startedAt: number;
  /** Gives back the provider's concurrency slot, held while the stream runs. */
  release(): void;
}

/** The provider's events, from the first one read, as the caller's format has them. */
async function* translated(
  first: EventSourceMessage,
  rest: AsyncGenerator<EventSourceMessage>,
  translate: StreamTranslator,
): AsyncGenerator<EventSourceMessage> {
  yield* translate(first);
  for await (const event of rest) yield* translate(event);
}

export async function openStream(
  up: Upstreams,
  operation: StreamingOperation,
  plan: InferencePlan,
  ctx: CallContext,
): Promise<OpenedStream> {
  const route = routeFor(up, requestOf(operation, plan, ctx));
  const opened = await executePlan(
    route,
    async (e, signal) => {
      const startedAt = performance.now();
      const body = withFields(plan.upstreamBody, optionsFor(e, plan.preferences));
      const requireParameters = plan.preferences?.require_parameters === true;
      const {
        response: res,
        translate,
        dropped,
      } = await openEndpointStream(up.http, e, operation, body, { signal, env: up.env, requireParameters });
      const raw = sseEvents(res.body, up.http.maxAnswerBytes, () => up.http.answerTooLarge(e.provider.slug));
      try {
        const first = await raw.next();
        if (first.done) throw new UpstreamFailure('invalid_response', e.provider.slug, 'Provider ended the stream before sending anything');
        const refused = streamErrorOf(e, first.value);
        if (refused) throw refused;
        const events = translate ? translated(first.value, raw, translate) : raw;
        const head = translate ? await events.next() : first;
        if (head.done) throw new UpstreamFailure('invalid_response', e.provider.slug, 'Provider ended the stream before sending anything');
        return { events, first: head.value, startedAt, dropped };
      } catch (err) {
        res.body.destroy();
        throw up.http.classify(err, e.provider.slug, e.provider.timeout_ms);
      }
    },
    {
      limiter: up.limiter,
      stats: up.stats,
      observer: up.observer,
      signal: ctx.signal,
      holdSlot: true,
      measure: () => null,
      workspaceId: ctx.workspaceId,
    },
  );
  return { endpoint: opened.endpoint, attempts: opened.attempts, release: opened.release, ...opened.response };
}
