// Per-process memory of recently authenticated keys, so a request usually costs no database read
// to authenticate (on FerretDB an `_id` lookup is the slowest step before a decision starts).
// Only live keys are remembered: an unknown or revoked token always reads the store and cannot
// fill memory. Tokens not in memory are looked up together: those asked for while a lookup is in
// flight wait for it and go in the next, one read of the set (infrastructure/concurrency/gathered);
// read one by one, a flood of made-up keys cost FerretDB 0.6 ms and this process 0.8 ms a request.
// A key revoked through this process is forgotten at once; one revoked elsewhere
// (another API process, the CLI) is refused here within `ttlMs`. A key in use is re-read in the
// background (soon, see soon.ts) once past half its TTL, so a busy key never makes a request wait
// for the store. Through a database outage a known key keeps working: when its re-read fails with
// the database unreachable, or takes longer than READ_PATIENCE_MS, the key as last read is served
// (for up to STALE_MAX_MS), so inference goes on while billing goes to the journal. Revocations
// made elsewhere during the outage are seen once the database answers again.
import type { ApiKeyDoc, Store } from '../../infrastructure/store';
import { ServiceUnavailableError } from '../../infrastructure/errors';
import { liveKeysByHash, tokenHash } from './keys';
import { Gathered } from '../../infrastructure/concurrency/gathered';
import { Soon } from '../../infrastructure/concurrency/soon';

/** How long a key last read live may be served while the database cannot answer. */
const STALE_MAX_MS = 3_600_000;
/** How long an expired key's re-read is waited for before the key as last read is served. */
const READ_PATIENCE_MS = 1_000;

export class KeyCache {
  private readonly entries = new Map<string, { doc: ApiKeyDoc; at: number }>();
  /** Reads in flight, by hash: one per key however many requests ask. */
  private readonly reading = new Map<string, Promise<ApiKeyDoc | null>>();
  private readonly renewals = new Soon();
  private readonly lookups: Gathered<ApiKeyDoc>;
  /** Bumped by `forget`, so a read that began before it cannot bring a forgotten key back. */
  private forgets = 0;

  constructor(
    private readonly store: Store,
    readonly ttlMs = 5_000,
    private readonly maxEntries = 10_000,
    private readonly now: () => number = Date.now,
  ) {
    this.lookups = new Gathered((hashes) => liveKeysByHash(store, hashes));
  }

  /** The key's record when the bearer token is a live key; null for anything else. */
  async authenticate(token: string): Promise<ApiKeyDoc | null> {
    const hash = tokenHash(token);
    if (!hash) return null;
    const hit = this.entries.get(hash);
    const age = hit ? this.now() - hit.at : Infinity;
    if (hit && age < this.ttlMs) {
      if (age >= this.ttlMs / 2) this.renewals.run(hash, () => this.read(hash));
      return hit.doc;
    }
    if (hit && age < STALE_MAX_MS) return this.readOrStale(hash, hit.doc);
    this.entries.delete(hash);
    return this.read(hash);
  }

  /** A fresh read of an expired key; the key as last read when the database cannot answer in time. */
  private async readOrStale(hash: string, stale: ApiKeyDoc): Promise<ApiKeyDoc | null> {
    if (this.store.away) {
      this.renewals.run(hash, () => this.read(hash));
      return stale;
    }
    const fresh = await this.store.patiently(this.read(hash), READ_PATIENCE_MS);
    return fresh ? fresh.value : stale;
  }

  private read(hash: string): Promise<ApiKeyDoc | null> {
    let pending = this.reading.get(hash);
    if (pending) return pending;
    // The database failed its last check: a key not in memory is refused at once, not after a timeout.
    if (!this.store.reachable)
      return Promise.reject(new ServiceUnavailableError('The database is unavailable right now; try again shortly'));
    const forgets = this.forgets;
    pending = this.lookups
      .get(hash)
      .then((found) => {
        const doc = found ?? null;
        this.entries.delete(hash);
        if (doc && this.ttlMs > 0 && forgets === this.forgets) {
          // A Map iterates in insertion order: when full, drop the key held longest.
          if (this.entries.size >= this.maxEntries) this.entries.delete(this.entries.keys().next().value as string);
          this.entries.set(hash, { doc, at: this.now() });
        }
        return doc;
      })
      .finally(() => {
        if (this.reading.get(hash) === pending) this.reading.delete(hash);
      });
    this.reading.set(hash, pending);
    return pending;
  }

  /** Forget a key by its public id, e.g. once this process has revoked it. */
  forget(keyId: string): void {
    this.forgets++;
    this.reading.clear(); // a call from now on reads afresh rather than wait for an answer from before
    for (const [hash, { doc }] of this.entries) if (doc.id === keyId) this.entries.delete(hash);
  }

  get size(): number {
    return this.entries.size;
  }
}
