// OpenTelemetry export to one destination: a tracer provider of the OpenTelemetry JS SDK whose
// batch processor hands spans to the SDK's OTLP/HTTP exporter, off the request path. A span is
// queued in memory and sent in batches; a destination that is down or slow costs the caller only
// the queueing (a full queue drops, never waits), and what it missed is counted.
import { randomBytes } from 'node:crypto';
import type { LookupFunction } from 'node:net';
import { context, trace, TraceFlags, type Attributes } from '@opentelemetry/api';
import { BatchSpanProcessor, TracerProvider, type IdGenerator, type ReadableSpan, type SpanExporter } from '@opentelemetry/sdk-trace';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { resourceFromAttributes } from '@opentelemetry/resources';

/** What happened to the spans of a destination: sent, refused or unreachable, or dropped from a full queue. */
export type SpanOutcome = 'exported' | 'failed' | 'dropped';

export interface SpanRecord {
  name: string;
  /** 32 hex digits: the trace the span belongs to. */
  traceId: string;
  /** 16 hex digits of the parent span, if the caller named one. */
  parentSpanId: string | null;
  startMs: number;
  endMs: number;
  attributes: Attributes;
  error: string | null;
}

export interface DestinationOptions {
  url: string;
  headers: Record<string, string>;
  /** Told how each span ended up (metrics). */
  count: (outcome: SpanOutcome, spans: number) => void;
  /** Spans held for this destination at most; more are dropped. */
  maxQueue?: number;
  /** How its host is resolved (a guard against private addresses, for destinations a workspace gave). */
  lookup?: LookupFunction;
}

/** Hands out the trace id the next span must have: the caller's, not a random one. */
class ChosenIds implements IdGenerator {
  next = '';
  generateTraceId(): string {
    return this.next;
  }
  generateSpanId(): string {
    return randomBytes(8).toString('hex');
  }
}

/** Counts what the exporter delivered or lost. */
class CountingExporter implements SpanExporter {
  constructor(
    private readonly inner: SpanExporter,
    private readonly settled: (outcome: SpanOutcome, spans: ReadableSpan[]) => void,
  ) {}
  export(spans: ReadableSpan[], done: Parameters<SpanExporter['export']>[1]): void {
    this.inner.export(spans, (result) => {
      this.settled(result.code === 0 ? 'exported' : 'failed', spans);
      done(result);
    });
  }
  shutdown(): Promise<void> {
    return this.inner.shutdown();
  }
  forceFlush(): Promise<void> {
    return this.inner.forceFlush?.() ?? Promise.resolve();
  }
}

export class TraceDestination {
  private readonly ids = new ChosenIds();
  private readonly provider: TracerProvider;
  private readonly tracer;
  /** Spans handed to the processor and not yet exported or failed. */
  private pending = 0;
  private readonly maxQueue: number;
  /** What to tell once a span has left (exported or failed), by its span id. */
  private readonly onSettled = new Map<string, () => void>();

  constructor(private readonly o: DestinationOptions) {
    this.maxQueue = o.maxQueue ?? 2048;
    const exporter = new CountingExporter(
      new OTLPTraceExporter({
        url: o.url,
        headers: o.headers,
        timeoutMillis: 5_000,
        ...(o.lookup && { httpAgentOptions: { lookup: o.lookup } }),
      }),
      (outcome, spans) => {
        this.pending -= spans.length;
        o.count(outcome, spans.length);
        for (const span of spans) this.settle(span.spanContext().spanId);
      },
    );
    this.provider = new TracerProvider({
      idGenerator: this.ids,
      resource: resourceFromAttributes({ 'service.name': 'inference-gateway' }),
      spanProcessors: [
        new BatchSpanProcessor({ exporter, maxQueueSize: this.maxQueue, scheduledDelayMillis: 1000, maxExportBatchSize: 256 }),
      ],
    });
    this.tracer = this.provider.getTracer('inference-gateway');
  }

  /**
   * Whether a span would be queued now; when not, it is counted as dropped. Asked before a span is
   * built, so a destination that has stopped taking spans costs a call nothing but this check.
   */
  accepts(): boolean {
    if (this.pending < this.maxQueue) return true;
    this.o.count('dropped', 1);
    return false;
  }

  /**
   * Queues the span (after `accepts`); never waits on the destination. `settled` is told once the
   * span has left the queue, exported or failed (or the destination is closed).
   */
  emit(s: SpanRecord, settled?: () => void): void {
    this.pending++;
    const parent = s.parentSpanId
      ? trace.setSpanContext(context.active(), {
          traceId: s.traceId,
          spanId: s.parentSpanId,
          traceFlags: TraceFlags.SAMPLED,
          isRemote: true,
        })
      : context.active();
    this.ids.next = s.traceId; // read synchronously by startSpan when there is no parent
    const span = this.tracer.startSpan(s.name, { startTime: s.startMs, attributes: s.attributes, root: !s.parentSpanId }, parent);
    if (s.error) span.setStatus({ code: 2, message: s.error });
    if (settled) this.onSettled.set(span.spanContext().spanId, settled);
    span.end(s.endMs);
  }

  private settle(spanId: string): void {
    const settled = this.onSettled.get(spanId);
    if (!settled) return;
    this.onSettled.delete(spanId);
    settled();
  }

  async flush(): Promise<void> {
    await this.provider.forceFlush();
  }

  async close(): Promise<void> {
    await this.provider.shutdown().catch(() => undefined);
    // Whatever the shutdown did not send is gone with this destination.
    for (const spanId of [...this.onSettled.keys()]) this.settle(spanId);
  }
}
