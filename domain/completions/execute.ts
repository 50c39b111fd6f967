// Calls a provider for an inference request through the routing engine: `complete` for an answer
// in one piece, `openStream` for a stream. A stream counts as started at its first event: until
// then any failure (refused, an error status, an error event, an empty stream) falls back to the
// next endpoint; after it, nothing does, and the stream's own end says how it went.
import type { EventSourceMessage } from 'eventsource-parser';
import type { Endpoint } from '../catalog';
import { openEndpointStream, streamErrorOf } from '../routing/endpoint-call';
import { UpstreamFailure } from '../../infrastructure/providers/failure';
import { optionsFor } from '../routing/engine';
import { executePlan, type Attempt } from '../routing/execute';
import { invoke, routeFor, type Invocation, type InvokeRequest, type Upstreams } from '../routing/upstreams';
import type { InferenceOperation, StreamingOperation } from './formats';
import type { InferencePlan } from './request';
import { sseEvents } from './sse';

export interface CallContext {
  workspace: { only?: string[]; ignore?: string[] } | undefined;
  signal: AbortSignal;
}

function requestOf(operation: InferenceOperation, plan: InferencePlan, ctx: CallContext): InvokeRequest {
  return {
    models: plan.models,
    variant: plan.variant,
    operation,
    preferences: plan.preferences,
    workspace: ctx.workspace,
    parameters: plan.parameters,
    body: plan.upstreamBody,
    signal: ctx.signal,
  };
}

export function complete(up: Upstreams, operation: InferenceOperation, plan: InferencePlan, ctx: CallContext): Promise<Invocation> {
  return invoke(up, requestOf(operation, plan, ctx));
}

export interface OpenedStream {
  endpoint: Endpoint;
  /** The first event, already read; then the rest. */
  first: EventSourceMessage;
  events: AsyncGenerator<EventSourceMessage>;
  attempts: Attempt[];
  /** When the call was made (performance.now()). */
  startedAt: number;
  /** Gives back the provider's concurrency slot, held while the stream runs. */
  release(): void;
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
      const body = { ...plan.upstreamBody, ...optionsFor(e, plan.preferences) };
      const res = await openEndpointStream(up.http, e, operation, body, { signal, env: up.env });
      const events = sseEvents(res.body);
      try {
        const first = await events.next();
        if (first.done) throw new UpstreamFailure('invalid_response', e.provider.slug, 'Provider ended the stream before sending anything');
        const refused = streamErrorOf(e, first.value);
        if (refused) throw refused;
        return { events, first: first.value, startedAt };
      } catch (err) {
        res.body.destroy();
        throw up.http.classify(err, e.provider.slug, e.provider.timeout_ms);
      }
    },
    { limiter: up.limiter, stats: up.stats, observer: up.observer, signal: ctx.signal, holdSlot: true, measure: () => null },
  );
  return { endpoint: opened.endpoint, attempts: opened.attempts, release: opened.release, ...opened.response };
}
