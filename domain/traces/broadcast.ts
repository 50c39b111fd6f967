// Trace broadcast: every generation (a chat call, a decision, a batch line) is sent as a span to
// the operator's destination (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) and to each of its workspace's
// own. Nothing here is on the request path: `generation` queues spans and returns; a workspace's
// destinations are read in the background (cached, like its balance; the previous list is served
// while it is read again) and only a workspace's first span waits for that read, never the call.
import type { Store } from '../../infrastructure/store';
import { TraceDestination, type SpanOutcome, type SpanRecord } from '../../infrastructure/tracing';
import { guardedLookup } from '../webhooks/address';
import { listDestinations, type TraceDestinationDoc } from './destinations';
import { contentOmitted, contentSize, generationSpan, type Generation } from './span';
import { RecentlyUsed } from '../../infrastructure/concurrency/recently-used';

export type { Generation } from './span';

export interface BroadcastOptions {
  /** The operator's destination, if any. */
  global: { url: string; headers: Record<string, string>; includeContent: boolean } | null;
  allowPrivate: boolean;
  /** Told what happened to spans: `global` or `workspace` destinations. */
  count?: (destination: 'global' | 'workspace', outcome: SpanOutcome, spans: number) => void;
  /**
   * Characters of prompts and answers this process may hold queued for destinations, all of them
   * together; past it a span goes without them (`gateway.content_omitted`), and `omitted` is told.
   */
  maxContentQueued: number;
  omitted?: (destination: 'global' | 'workspace') => void;
  /** How long a workspace's list of destinations is trusted. */
  cacheMs?: number;
  /** How long a workspace's destinations are kept unused (tests; see RecentlyUsed). */
  idleMs?: number;
  now?: () => number;
}

/** A workspace destination as the broadcaster sends to it. */
interface Listed {
  sink: TraceDestination;
  includeContent: boolean;
}

/** A workspace's destinations as last read, the read that refreshes them, and their exporters. */
interface Cached {
  at: number;
  reading: Promise<Listed[]>;
  /** The list once read: served while a newer read is on its way, so no span waits for the database then. */
  listed: Listed[] | null;
  /** Each destination's exporter, by the destination's `_id`, with what it was made for. */
  sinks: Map<string, { key: string; sink: TraceDestination }>;
}

/** A generation's span in the forms destinations take, each built once, on first need. */
class SpanForms {
  private plainSpan: SpanRecord | undefined;
  private fullSpan: SpanRecord | undefined;
  private omittedSpan: SpanRecord | undefined;
  constructor(private readonly g: Generation) {}
  get plain(): SpanRecord {
    return (this.plainSpan ??= generationSpan(this.g, false));
  }
  get full(): SpanRecord {
    return (this.fullSpan ??= generationSpan(this.g, true));
  }
  get omitted(): SpanRecord {
    return (this.omittedSpan ??= contentOmitted(this.plain));
  }
}

export class Broadcaster {
  private readonly global: { sink: TraceDestination; includeContent: boolean } | null;
  /** Characters of content in spans queued for any destination of this process. */
  private contentQueued = 0;
  /** Workspaces sending spans lately; one left unused is forgotten, its exporters closed (their spans sent). */
  private readonly cache: RecentlyUsed<Cached>;
  private readonly cacheMs: number;

  constructor(
    private readonly store: Store,
    private readonly o: BroadcastOptions,
  ) {
    this.cacheMs = o.cacheMs ?? 5_000;
    this.cache = new RecentlyUsed<Cached>({ idleMs: o.idleMs, now: o.now, onDrop: (c) => void closeAll(c.sinks) });
    this.global = o.global && {
      sink: new TraceDestination({ url: o.global.url, headers: o.global.headers, count: (outcome, n) => o.count?.('global', outcome, n) }),
      includeContent: o.global.includeContent,
    };
  }

  /** Queues the generation's span for every destination; returns at once. */
  generation(g: Generation): void {
    const forms = new SpanForms(g);
    if (this.global?.sink.accepts()) this.send(this.global.sink, this.global.includeContent, forms, 'global');
    const c = this.destinationsOf(g.workspaceId);
    if (c.listed) return this.emit(c.listed, forms);
    c.reading.then(
      (listed) => this.emit(listed, forms),
      () => this.o.count?.('workspace', 'dropped', 1), // the list could not be read: counted, never thrown
    );
  }

  private emit(listed: Listed[], forms: SpanForms): void {
    for (const d of listed) if (d.sink.accepts()) this.send(d.sink, d.includeContent, forms, 'workspace');
  }

  /** Queues the span in the form the destination takes, its content only while there is room for it. */
  private send(sink: TraceDestination, includeContent: boolean, forms: SpanForms, destination: 'global' | 'workspace'): void {
    if (!includeContent) return sink.emit(forms.plain);
    // Full already: the content is not even serialised.
    const size = this.contentQueued < this.o.maxContentQueued ? contentSize(forms.full) : Infinity;
    if (this.contentQueued + size > this.o.maxContentQueued) {
      this.o.omitted?.(destination);
      return sink.emit(forms.omitted);
    }
    this.contentQueued += size;
    sink.emit(forms.full, () => (this.contentQueued -= size));
  }

  /** The workspace's destinations, read again in the background once the cache period has passed. */
  private destinationsOf(workspaceId: string): Cached {
    const now = this.o.now ?? Date.now;
    let c = this.cache.get(workspaceId);
    if (c && now() - c.at < this.cacheMs) return c;
    if (!c) this.cache.set(workspaceId, (c = { at: 0, reading: Promise.resolve([]), listed: null, sinks: new Map() }));
    const cached = c;
    // Only the latest read of a workspace still kept may touch its exporters: an earlier one
    // answering late holds an older list, and a forgotten workspace's exporters are closed.
    const current = () => cached.reading === reading && this.cache.peek(workspaceId) === cached;
    const reading: Promise<Listed[]> = listDestinations(this.store, workspaceId).then((docs) =>
      current() ? this.sinksOf(cached.sinks, docs) : (cached.listed ?? []),
    );
    cached.at = now();
    cached.reading = reading;
    reading.then(
      (listed) => current() && (cached.listed = listed),
      () => current() && (cached.at = 0), // read again by the next span
    );
    return cached;
  }

  /** One exporter per destination, made anew when its endpoint or headers change; a removed one's is closed. */
  private sinksOf(sinks: Cached['sinks'], docs: TraceDestinationDoc[]): Listed[] {
    const ids = new Set(docs.map((d) => d._id));
    for (const [id, known] of sinks) {
      if (!ids.has(id)) {
        void known.sink.close();
        sinks.delete(id);
      }
    }
    return docs.map((d) => {
      const key = JSON.stringify([d.endpoint, d.headers]);
      let known = sinks.get(d._id);
      if (known?.key !== key) {
        void known?.sink.close();
        const sink = new TraceDestination({
          url: d.endpoint,
          headers: d.headers,
          lookup: guardedLookup(this.o.allowPrivate),
          count: (outcome, n) => this.o.count?.('workspace', outcome, n),
        });
        known = { key, sink };
        sinks.set(d._id, known);
      }
      return { sink: known.sink, includeContent: d.include_content };
    });
  }

  /** Sends what is queued (tests, shutdown). */
  async flush(): Promise<void> {
    await Promise.all([this.global?.sink.flush(), ...[...this.workspaceSinks()].map((s) => s.flush())]);
  }

  async close(): Promise<void> {
    await Promise.all([this.global?.sink.close(), ...[...this.workspaceSinks()].map((s) => s.close())]);
  }

  private *workspaceSinks(): IterableIterator<TraceDestination> {
    for (const c of this.cache.values()) for (const { sink } of c.sinks.values()) yield sink;
  }
}

function closeAll(sinks: Cached['sinks']): Promise<unknown> {
  return Promise.all([...sinks.values()].map(({ sink }) => sink.close()));
}
