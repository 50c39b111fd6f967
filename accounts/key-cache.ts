// Per-process memory of recently authenticated keys, so a request usually costs no database read
// to authenticate (on FerretDB an `_id` lookup is the slowest step before a decision starts).
// Only live keys are remembered: an unknown or revoked token always reads the store and cannot
// fill memory. A key revoked through this process is forgotten at once; one revoked elsewhere
// (another API process, the CLI) is refused here within `ttlMs`.
import type { ApiKeyDoc, Store } from '../store';
import { liveKeyByHash, tokenHash } from './keys';

export class KeyCache {
  private readonly entries = new Map<string, { doc: ApiKeyDoc; at: number }>();

  constructor(
    private readonly store: Store,
    readonly ttlMs = 5_000,
    private readonly maxEntries = 10_000,
    private readonly now: () => number = Date.now,
  ) {}

  /** The key's record when the bearer token is a live key; null for anything else. */
  async authenticate(token: string): Promise<ApiKeyDoc | null> {
    const hash = tokenHash(token);
    if (!hash) return null;
    const hit = this.entries.get(hash);
    if (hit && this.now() - hit.at < this.ttlMs) return hit.doc;
    this.entries.delete(hash);
    const doc = await liveKeyByHash(this.store, hash);
    if (doc && this.ttlMs > 0) {
      // A Map iterates in insertion order: when full, drop the key held longest.
      if (this.entries.size >= this.maxEntries) this.entries.delete(this.entries.keys().next().value as string);
      this.entries.set(hash, { doc, at: this.now() });
    }
    return doc;
  }

  /** Forget a key by its public id, e.g. once this process has revoked it. */
  forget(keyId: string): void {
    for (const [hash, { doc }] of this.entries) if (doc.id === keyId) this.entries.delete(hash);
  }

  get size(): number {
    return this.entries.size;
  }
}
