// Live endpoint statistics: latency and throughput percentiles and recent failures over a rolling
// window, measured by whichever process made the call and shared through MongoDB. Each process
// buffers its measurements and inserts one compact summary every few seconds (inserts only:
// FerretDB has no atomic read-modify-write); counts are exact, latencies a bounded sample, so a
// busy window stays cheap to read. Each process keeps the window's summaries it has read and reads
// only the newer ones: reading the whole window every two seconds, in every process, kept FerretDB
// busy for five minutes after a load (228-750 ms of CPU a second with two API processes). It
// rebuilds its snapshot when it reads, off the request path: sorting a busy window's samples took
// milliseconds, and a call that rebuilt it paid them before its upstream request was sent.
import { randomBytes } from 'node:crypto';
import type { EndpointSummary as Summary, Store } from '../../infrastructure/store';
import { fromJsonText, toJsonText } from '../../infrastructure/store/json-text';
import type { EndpointStat, Percentile, Percentiles, StatsSnapshot } from './engine';

export interface Sample {
  ok: boolean;
  latencyMs: number;
  outputTokens: number;
}

const PERCENTILES: [Percentile, number][] = [
  ['p50', 0.5],
  ['p75', 0.75],
  ['p90', 0.9],
  ['p99', 0.99],
];
/** Latency and throughput values one summary keeps per endpoint. */
const SAMPLES_PER_FLUSH = 64;
/** A stored value's precision (hundredths of a millisecond, of a token a second): a third of the text. */
const round = (n: number) => Math.round(n * 100) / 100;
/**
 * How far before its last read a refresh reads again. A summary's `_id` is its time before its
 * insert, which lands later (milliseconds; seconds on a struggling database), so ids already read
 * are skipped rather than assumed to be all there is up to the last read. One stored more than this
 * after its time is missed by processes that read past it: a few seconds of routing statistics. So
 * are a process's summaries by processes whose clocks run more than this ahead of its own.
 */
const LATE_MS = 10_000;

function percentiles(values: number[]): Percentiles | null {
  if (!values.length) return null;
  const sorted = Float64Array.from(values).sort(); // numeric, and a third of a comparator sort's time
  const out: Percentiles = {};
  for (const [name, q] of PERCENTILES) out[name] = sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)];
  return out;
}

/** Keeps every k-th value once more than `max` arrived, so a summary is a fair sample of its interval. */
function addSample(list: number[], value: number, seen: number): void {
  if (list.length < SAMPLES_PER_FLUSH) list.push(value);
  else list[seen % SAMPLES_PER_FLUSH] = value;
}

export class LiveStats {
  private readonly instance = randomBytes(6).toString('hex');
  private seq = 0;
  private pending = new Map<string, Summary & { seen: number }>();
  /** The window's summaries read or written by this process, by document `_id`. */
  private readonly shared = new Map<string, { at: number; endpoints: Summary[] }>();
  /** When the last refresh read (this process's clock); the next reads from `LATE_MS` before it. */
  private readAt: number | null = null;
  /** `shared` changed since the snapshot was built: at rest, a refresh rebuilds nothing. */
  private changed = true;
  private timer: NodeJS.Timeout | null = null;
  private running = false;
  /** Routing reads this on every call; `refresh` rebuilds it, a failure is added to it at once. */
  private cached: Map<string, EndpointStat> | null = null;

  constructor(
    private readonly store: Store,
    readonly windowMs = 5 * 60_000,
    private readonly now: () => number = Date.now,
  ) {}

  record(endpointKey: string, s: Sample): void {
    let p = this.pending.get(endpointKey);
    if (!p) this.pending.set(endpointKey, (p = { e: endpointKey, ok: 0, failed: 0, last_failure: null, ms: [], tps: [], seen: 0 }));
    if (!s.ok) {
      p.failed++;
      p.last_failure = this.now();
      // An outage counts at once; the next rebuild counts this failure from `pending` instead.
      const stat = this.cached?.get(endpointKey);
      this.cached?.set(endpointKey, {
        latency: stat?.latency ?? null,
        throughput: stat?.throughput ?? null,
        requests: stat?.requests ?? 0,
        failures: (stat?.failures ?? 0) + 1,
        lastFailureAt: p.last_failure,
      });
      return;
    }
    p.ok++;
    addSample(p.ms, s.latencyMs, p.seen);
    const seconds = s.latencyMs / 1000;
    if (s.outputTokens > 0 && seconds > 0) addSample(p.tps, s.outputTokens / seconds, p.seen);
    p.seen++;
  }

  /** Writes this process's buffered measurements as one document. */
  async flush(): Promise<void> {
    if (!this.pending.size) return;
    const at = this.now();
    const endpoints = [...this.pending.values()].map(({ seen: _seen, ...s }) => ({ ...s, ms: s.ms.map(round), tps: s.tps.map(round) }));
    this.pending = new Map();
    const _id = `${timeKey(at)}:${this.instance}:${this.seq++}`;
    try {
      await this.store.endpointSamples.insertOne({ _id, at: new Date(at), endpoints: toJsonText(endpoints) });
      this.shared.set(_id, { at, endpoints });
      this.changed = true;
    } catch {
      // Try again next flush, together with whatever was measured while this write failed.
      for (const s of endpoints) {
        const p = this.pending.get(s.e);
        if (!p) {
          this.pending.set(s.e, { ...s, seen: s.ms.length });
          continue;
        }
        p.ok += s.ok;
        p.failed += s.failed;
        p.last_failure = Math.max(p.last_failure ?? 0, s.last_failure ?? 0) || null;
        p.ms = [...s.ms, ...p.ms].slice(-SAMPLES_PER_FLUSH);
        p.tps = [...s.tps, ...p.tps].slice(-SAMPLES_PER_FLUSH);
      }
    }
  }

  /**
   * Reads every process's summaries written since the last read (the whole window the first time),
   * forgets those past the window and drops documents older than two windows.
   */
  async refresh(): Promise<void> {
    const now = this.now();
    const since = now - this.windowMs;
    const from = this.readAt === null ? since : Math.max(since, this.readAt - LATE_MS);
    // Keyed by time first: the window is one `_id` range (FerretDB reads nothing else from an index).
    const docs = await this.store.endpointSamples.find({ _id: { $gte: timeKey(from) }, at: { $gte: new Date(from) } }).toArray();
    this.readAt = now;
    for (const d of docs) {
      if (this.shared.has(d._id)) continue;
      const endpoints = typeof d.endpoints === 'string' ? fromJsonText<Summary[]>(d.endpoints) : (d.endpoints ?? []);
      this.shared.set(d._id, { at: d.at.getTime(), endpoints });
      this.changed = true;
    }
    for (const [id, d] of this.shared) {
      if (d.at >= since) continue;
      this.shared.delete(id);
      this.changed = true;
    }
    if (this.changed || this.pending.size || !this.cached) this.cached = this.build(this.now());
    this.changed = false;
    await this.store.endpointSamples.deleteMany({ _id: { $lt: timeKey(since - this.windowMs) } }).catch(() => undefined);
  }

  /** As of the last `refresh` (every two seconds), with failures since; built here only before the first. */
  snapshot(): StatsSnapshot {
    this.cached ??= this.build(this.now());
    return this.cached;
  }

  private build(now: number): Map<string, EndpointStat> {
    const since = now - this.windowMs;
    const by = new Map<string, Summary[]>();
    const summaries: Summary[] = [...this.pending.values()];
    for (const d of this.shared.values()) if (d.at >= since) summaries.push(...d.endpoints);
    for (const s of summaries) {
      let list = by.get(s.e);
      if (!list) by.set(s.e, (list = []));
      list.push(s);
    }
    const out = new Map<string, EndpointStat>();
    for (const [key, list] of by) {
      const failures = list.filter((s) => s.last_failure !== null).map((s) => s.last_failure!);
      out.set(key, {
        latency: percentiles(list.flatMap((s) => s.ms.map((ms) => ms / 1000))),
        throughput: percentiles(list.flatMap((s) => s.tps)),
        requests: list.reduce((n, s) => n + s.ok, 0),
        failures: list.reduce((n, s) => n + s.failed, 0),
        lastFailureAt: failures.length ? Math.max(...failures) : null,
      });
    }
    return out;
  }

  /** Flushes and refreshes every `intervalMs` until stopped. */
  start(intervalMs = 2_000): void {
    this.running = true;
    const tick = async () => {
      await this.flush();
      await this.refresh().catch(() => undefined);
      if (!this.running) return;
      this.timer = setTimeout(() => void tick(), intervalMs);
      this.timer.unref();
    };
    void tick();
  }

  async stop(): Promise<void> {
    this.running = false;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    await this.flush();
  }
}

/** A time as the start of a samples document's `_id`: fixed-width base 36, so ids sort by time. */
function timeKey(ms: number): string {
  return Math.max(0, Math.floor(ms)).toString(36).padStart(9, '0');
}
