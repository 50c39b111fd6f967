// The process's Prometheus metrics, all named here. Label values come from bounded sets only (route
// templates, catalog ids, provider slugs, outcome kinds, up to SPEND_SERIES workspace ids): never keys, prompts or
// anything else a caller writes.
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from 'prom-client';
import { joinClusterMetrics } from './cluster';
import { logLinesDropped } from '../log/stdout';

/** What the routing layer reports about each provider call; `Metrics` is one, a test may be another. */
export interface UpstreamObserver {
  /** One attempt at an endpoint: `ok`, or the kind of failure it was. */
  call(provider: string, model: string, outcome: string, seconds: number): void;
  /** A failed attempt that moved on to another endpoint. */
  fallback(model: string): void;
}

/** Spend series a process labels by workspace before counting the rest under OTHER_WORKSPACES. */
export const SPEND_SERIES = 1_000;
const OTHER_WORKSPACES = 'other';
/** Scrape texts made afresh per second at most (Prometheus scrapes every 15 s by default; tests a few times a second). */
const FRESH_SCRAPES_PER_SECOND = 10;

const LATENCY_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120];

export class Metrics implements UpstreamObserver {
  readonly registry = new Registry();
  readonly httpRequests = new Histogram({
    name: 'gateway_http_request_duration_seconds',
    help: 'HTTP requests by method, route template and status',
    labelNames: ['method', 'route', 'status'] as const,
    buckets: LATENCY_BUCKETS,
    registers: [this.registry],
  });
  readonly upstreamCalls = new Histogram({
    name: 'gateway_upstream_request_duration_seconds',
    help: 'Calls to model providers by provider, model and outcome (ok or the failure kind)',
    labelNames: ['provider', 'model', 'outcome'] as const,
    buckets: LATENCY_BUCKETS,
    registers: [this.registry],
  });
  readonly fallbacks = new Counter({
    name: 'gateway_fallbacks_total',
    help: 'Failed provider attempts after which the next endpoint was tried',
    labelNames: ['model'] as const,
    registers: [this.registry],
  });
  readonly rateLimited = new Counter({
    name: 'gateway_rate_limit_rejections_total',
    help: "Requests refused with 429 by a rate limit: the key's, or its workspace's over all its keys",
    labelNames: ['scope'] as const,
    registers: [this.registry],
  });
  readonly rateUnchecked = new Counter({
    name: 'gateway_rate_limit_unchecked_total',
    help: 'Requests admitted without a rate-limit ticket: the database did not answer a claim in time, so the limit failed open',
    registers: [this.registry],
  });
  readonly paymentRequired = new Counter({
    name: 'gateway_payment_required_total',
    help: 'Requests refused with 402 (no credits left)',
    registers: [this.registry],
  });
  readonly decisions = new Counter({
    name: 'gateway_decisions_total',
    help: 'Decisions answered, by execution mode',
    labelNames: ['mode'] as const,
    registers: [this.registry],
  });
  readonly batchLines = new Counter({
    name: 'gateway_batch_lines_total',
    help: 'Batch lines processed by this process, by outcome (completed or failed)',
    labelNames: ['outcome'] as const,
    registers: [this.registry],
  });
  readonly traceContentOmitted = new Counter({
    name: 'gateway_trace_content_omitted_total',
    help: 'Spans sent without their prompt and answer to a destination that asked for them, because the process held its bound of content waiting to be sent (TRACE_CONTENT_QUEUE_BYTES), by destination (global or workspace)',
    labelNames: ['destination'] as const,
    registers: [this.registry],
  });
  readonly traceSpans = new Counter({
    name: 'gateway_trace_spans_total',
    help: 'Generation spans by destination (global or workspace) and outcome: exported, failed (the destination refused or was unreachable) or dropped (its queue was full)',
    labelNames: ['destination', 'outcome'] as const,
    registers: [this.registry],
  });
  private readonly spend = new Counter({
    name: 'gateway_spend_usd_total',
    help: `USD billed through this process, by workspace: the first ${SPEND_SERIES} workspaces it bills, then "${OTHER_WORKSPACES}" for the rest`,
    labelNames: ['workspace'] as const,
    registers: [this.registry],
  });
  /** The workspaces with a spend series of their own in this process. */
  private readonly spendSeries = new Set<string>();

  /**
   * Batches created and closed here: counters, not a gauge read from the database at each scrape
   * (its cost grew with history). Batches in flight = created − finished, summed over processes.
   */
  readonly batchesCreated = new Counter({
    name: 'gateway_batches_created_total',
    help: 'Batches created through this process',
    registers: [this.registry],
  });

  readonly batchesFinished = new Counter({
    name: 'gateway_batches_finished_total',
    help: 'Batches closed by this process, by terminal status',
    labelNames: ['status'] as const,
    registers: [this.registry],
  });

  /** Read at each scrape: the log itself may be what nobody reads. */
  readonly logLinesDropped = new Counter({
    name: 'gateway_log_lines_dropped_total',
    help: 'JSON log lines dropped because stdout did not take them (LOG_BUFFER_BYTES of lines were already waiting)',
    registers: [this.registry],
    collect() {
      this.reset();
      this.inc(logLinesDropped());
    },
  });

  readonly connectionsShed = new Counter({
    name: 'gateway_connections_shed_total',
    help: 'Client connections closed at MAX_CONNECTIONS: evicted (idle, to make room for a new one) or refused (every connection had a request in progress)',
    labelNames: ['how'] as const,
    registers: [this.registry],
  });

  /** Client connections open in this API process, read at each scrape. */
  watchConnections(open: () => number): void {
    new Gauge({
      name: 'gateway_connections',
      help: 'Client connections open in this API process (at most MAX_CONNECTIONS)',
      registers: [this.registry],
      collect() {
        this.set(open());
      },
    });
  }

  /**
   * Request bodies held while they arrive, read at each scrape: in memory (every body until it has
   * arrived) and on disk (batch bodies over 1 MB). Each has a room per process (api/body-memory.ts,
   * api/batch-body.ts); near it, workspaces' uploads are being refused with 429s.
   */
  watchBodies(held: { memory: () => number; disk: () => number }): void {
    new Gauge({
      name: 'gateway_request_body_bytes',
      help: 'Bytes of request bodies this process holds while they arrive, by where they are held (memory, or disk for large batch bodies)',
      labelNames: ['held_in'] as const,
      registers: [this.registry],
      collect() {
        this.set({ held_in: 'memory' }, held.memory());
        this.set({ held_in: 'disk' }, held.disk());
      },
    });
  }

  /**
   * The usage ledger, read at each scrape: records journaled and waiting for the database (at the
   * ledger's bound, calls are refused with 503), and whether the journal refuses records (a full
   * disk: each record then goes to the database before its answer).
   */
  watchUsage(usage: { backlogBytes: number; journalFailing: boolean }): void {
    new Gauge({
      name: 'gateway_usage_unstored_bytes',
      help: 'Usage records this process has journaled that the database has not taken yet (rising: the database is down, slow or full)',
      registers: [this.registry],
      collect() {
        this.set(usage.backlogBytes);
      },
    });
    new Gauge({
      name: 'gateway_usage_journal_failing',
      help: '1 for each process whose usage journal refuses records (its disk is full or read-only): each record then goes to the database before its answer',
      registers: [this.registry],
      collect() {
        this.set(usage.journalFailing ? 1 : 0);
      },
    });
  }

  constructor() {
    collectDefaultMetrics({ register: this.registry, prefix: 'gateway_' });
  }

  call(provider: string, model: string, outcome: string, seconds: number): void {
    this.upstreamCalls.observe({ provider, model, outcome }, seconds);
  }

  fallback(model: string): void {
    this.fallbacks.inc({ model });
  }

  /**
   * A stored usage record's cost. Each series costs every scrape: 100,000 workspaces made a scrape
   * hold the event loop 365 ms and answer 7 MB, and the set only grew. So a process labels the first
   * SPEND_SERIES workspaces it bills and counts the rest together; sums stay exact, and each
   * workspace's own spend is in the usage API.
   */
  billed(workspace: string, usd: number): void {
    if (!this.spendSeries.has(workspace)) {
      if (this.spendSeries.size >= SPEND_SERIES) workspace = OTHER_WORKSPACES;
      else this.spendSeries.add(workspace);
    }
    this.spend.inc({ workspace }, usd);
  }

  private source = (): Promise<string> => this.registry.metrics();

  /**
   * Under a cluster primary (API_PROCESSES > 1): every scrape of this process answers with the sum
   * over all its processes, this one counted as process `index` (when it serves requests).
   */
  shareAcrossProcesses(index: number, servesRequests = true): void {
    const requests = servesRequests
      ? async () => (await this.httpRequests.get()).values.reduce((n, v) => (v.metricName?.endsWith('_count') ? n + v.value : n), 0)
      : null;
    this.source = joinClusterMetrics(this.registry, index, requests);
  }

  /** When the last FRESH_SCRAPES_PER_SECOND texts were made (performance.now()), oldest first. */
  private readonly freshAt: number[] = [];
  private lastText: string | null = null;
  private making: Promise<string> | null = null;

  /**
   * The text a Prometheus scrape reads: made afresh at most FRESH_SCRAPES_PER_SECOND a second,
   * shared by the scrapes that arrive while it is made; past that rate the last text is served
   * again. A text costs the process ~3.5 ms of CPU (more with many spend series, and a round of
   * every process's under a cluster), and /metrics is open unless METRICS_TOKEN is set: 20 clients
   * scraping in a loop took another workspace's chat calls from ~1,800 to ~100 req/s.
   */
  text(): Promise<string> {
    if (this.making) return this.making;
    const now = performance.now();
    while (this.freshAt.length && now - this.freshAt[0] >= 1_000) this.freshAt.shift();
    if (this.lastText !== null && this.freshAt.length >= FRESH_SCRAPES_PER_SECOND) return Promise.resolve(this.lastText);
    this.freshAt.push(now);
    return (this.making = this.source()
      .then((text) => (this.lastText = text))
      .finally(() => (this.making = null)));
  }

  get contentType(): string {
    return this.registry.contentType;
  }
}

/** Reports nowhere: for callers that build upstreams without a metrics registry (tools, some tests). */
export const unobserved: UpstreamObserver = { call: () => undefined, fallback: () => undefined };
