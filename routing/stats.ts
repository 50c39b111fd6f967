// Live endpoint statistics: latency and throughput percentiles and recent failures over a rolling
// window, measured by whichever process made the call and shared through MongoDB. Each process
// buffers its samples and inserts them as one document every few seconds (inserts only: FerretDB
// has no atomic read-modify-write), and rebuilds its snapshot from the window's documents.
import { randomBytes } from 'node:crypto';
import type { Store } from '../store';
import type { EndpointStat, Percentile, Percentiles, StatsSnapshot } from './engine';

export interface Sample {
  ok: boolean;
  latencyMs: number;
  outputTokens: number;
}

const PERCENTILES: [Percentile, number][] = [['p50', 0.5], ['p75', 0.75], ['p90', 0.9], ['p99', 0.99]];

function percentiles(values: number[]): Percentiles | null {
  if (!values.length) return null;
  const sorted = [...values].sort((a, b) => a - b);
  const out: Percentiles = {};
  for (const [name, q] of PERCENTILES) out[name] = sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)];
  return out;
}

interface Row { e: string; ms: number; tps: number | null; ok: boolean; at: number }

export class LiveStats {
  private readonly instance = randomBytes(6).toString('hex');
  private seq = 0;
  private pending: Row[] = [];
  private shared: Row[] = [];
  private timer: NodeJS.Timeout | null = null;
  private running = false;

  constructor(
    private readonly store: Store,
    readonly windowMs = 5 * 60_000,
    private readonly now: () => number = Date.now,
  ) {}

  record(endpointKey: string, s: Sample): void {
    const seconds = s.latencyMs / 1000;
    this.pending.push({
      e: endpointKey, ms: s.latencyMs, ok: s.ok, at: this.now(),
      tps: s.ok && s.outputTokens > 0 && seconds > 0 ? s.outputTokens / seconds : null,
    });
  }

  /** Writes this process's buffered samples as one document. */
  async flush(): Promise<void> {
    if (!this.pending.length) return;
    const batch = this.pending;
    this.pending = [];
    try {
      await this.store.endpointSamples.insertOne({
        _id: `${this.instance}:${this.seq++}`,
        at: new Date(this.now()),
        samples: batch.map(({ e, ms, tps, ok }) => ({ e, ms, tps, ok })),
      });
      this.shared.push(...batch); // ours count at once, before the next refresh reads them back
    } catch {
      this.pending.unshift(...batch); // try again next flush
    }
  }

  /** Reads every process's samples in the window and drops documents older than two windows. */
  async refresh(): Promise<void> {
    const since = this.now() - this.windowMs;
    const docs = await this.store.endpointSamples.find({ at: { $gte: new Date(since) } }).toArray();
    this.shared = docs.flatMap((d) => d.samples.map((s) => ({ ...s, at: d.at.getTime() })));
    await this.store.endpointSamples.deleteMany({ at: { $lt: new Date(since - this.windowMs) } }).catch(() => undefined);
  }

  snapshot(): StatsSnapshot {
    const since = this.now() - this.windowMs;
    const by = new Map<string, Row[]>();
    for (const r of [...this.shared, ...this.pending]) {
      if (r.at < since) continue;
      let list = by.get(r.e);
      if (!list) by.set(r.e, (list = []));
      list.push(r);
    }
    const out = new Map<string, EndpointStat>();
    for (const [key, rows] of by) {
      const ok = rows.filter((r) => r.ok);
      const failed = rows.filter((r) => !r.ok);
      out.set(key, {
        latency: percentiles(ok.map((r) => r.ms / 1000)),
        throughput: percentiles(ok.flatMap((r) => (r.tps === null ? [] : [r.tps]))),
        requests: ok.length,
        failures: failed.length,
        lastFailureAt: failed.length ? Math.max(...failed.map((r) => r.at)) : null,
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
