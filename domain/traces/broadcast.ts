// Trace broadcast: every generation (a chat call, a decision, a batch line) is sent as a span to
// the operator's destination (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) and to each of its workspace's
// own. Nothing here is on the request path: `generation` queues spans and returns; a workspace's
// destinations are read in the background (cached, like its balance) and a span waits for that
// read, never the call.
import type { Store } from '../../infrastructure/store';
import { TraceDestination, type SpanOutcome } from '../../infrastructure/tracing';
import { guardedLookup } from '../webhooks/address';
import { listDestinations, type TraceDestinationDoc } from './destinations';
import { generationSpan, type Generation } from './span';

export type { Generation } from './span';

export interface BroadcastOptions {
  /** The operator's destination, if any. */
  global: { url: string; headers: Record<string, string>; includeContent: boolean } | null;
  allowPrivate: boolean;
  /** Told what happened to spans: `global` or `workspace` destinations. */
  count?: (destination: 'global' | 'workspace', outcome: SpanOutcome, spans: number) => void;
  /** How long a workspace's list of destinations is trusted. */
  cacheMs?: number;
}

interface Cached {
  at: number;
  list: Promise<TraceDestinationDoc[]>;
}

export class Broadcaster {
  private readonly global: { sink: TraceDestination; includeContent: boolean } | null;
  private readonly cache = new Map<string, Cached>();
  private readonly sinks = new Map<string, { key: string; sink: TraceDestination }>();
  private readonly cacheMs: number;

  constructor(
    private readonly store: Store,
    private readonly o: BroadcastOptions,
  ) {
    this.cacheMs = o.cacheMs ?? 5_000;
    this.global = o.global && {
      sink: new TraceDestination({ url: o.global.url, headers: o.global.headers, count: (outcome, n) => o.count?.('global', outcome, n) }),
      includeContent: o.global.includeContent,
    };
  }

  /** Queues the generation's span for every destination; returns at once. */
  generation(g: Generation): void {
    if (this.global?.sink.accepts()) this.global.sink.emit(generationSpan(g, this.global.includeContent));
    void this.destinationsOf(g.workspaceId)
      .then((list) => {
        let plain: ReturnType<typeof generationSpan> | null = null;
        let full: ReturnType<typeof generationSpan> | null = null;
        for (const d of list) {
          const sink = this.sinkFor(d);
          if (!sink.accepts()) continue;
          sink.emit(d.include_content ? (full ??= generationSpan(g, true)) : (plain ??= generationSpan(g, false)));
        }
      })
      .catch(() => this.o.count?.('workspace', 'dropped', 1)); // the list could not be read: counted, never thrown
  }

  private destinationsOf(workspaceId: string): Promise<TraceDestinationDoc[]> {
    const c = this.cache.get(workspaceId);
    if (c && Date.now() - c.at < this.cacheMs) return c.list;
    const list = listDestinations(this.store, workspaceId);
    this.cache.set(workspaceId, { at: Date.now(), list });
    list.catch(() => this.cache.delete(workspaceId));
    return list;
  }

  /** One exporter per destination, made anew when its endpoint or headers change. */
  private sinkFor(d: TraceDestinationDoc): TraceDestination {
    const key = JSON.stringify([d.endpoint, d.headers]);
    const known = this.sinks.get(d._id);
    if (known?.key === key) return known.sink;
    void known?.sink.close();
    const sink = new TraceDestination({
      url: d.endpoint,
      headers: d.headers,
      lookup: guardedLookup(this.o.allowPrivate),
      count: (outcome, n) => this.o.count?.('workspace', outcome, n),
    });
    this.sinks.set(d._id, { key, sink });
    return sink;
  }

  /** Sends what is queued (tests, shutdown). */
  async flush(): Promise<void> {
    await Promise.all([this.global?.sink.flush(), ...[...this.sinks.values()].map((s) => s.sink.flush())]);
  }

  async close(): Promise<void> {
    await Promise.all([this.global?.sink.close(), ...[...this.sinks.values()].map((s) => s.sink.close())]);
  }
}
