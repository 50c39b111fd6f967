// Preset versions kept by a process. A version never changes once written, and every call that names
// a preset reads its designated version, whose config and system prompt may be up to BODY_LIMIT:
// a call naming a preset of 9.5 MB cost FerretDB ~0.24 s of CPU to read it, each time.
import { SizedLru } from '../../infrastructure/concurrency/sized-lru';
import type { PresetVersionDoc } from '../../infrastructure/store';

/** Characters kept by an API process. */
const KEPT_CHARS = 64 * 1024 * 1024;
/** By a worker alone, which runs in a heap of 256 MB (docker-compose.yml); its lines read a preset once a chunk anyway. */
export const WORKER_KEPT_CHARS = 16 * 1024 * 1024;
/** The largest version kept: one of BODY_LIMIT's default (10 MB) is, since one read of it costs most. */
const KEPT_MAX_CHARS = 16 * 1024 * 1024;

/** What a version weighs (kept here, and against its workspace's storage quota): its config's and system prompt's characters. */
export function versionChars(v: Pick<PresetVersionDoc, 'config' | 'system_prompt'>): number {
  const config = typeof v.config === 'string' ? v.config.length : JSON.stringify(v.config ?? null).length;
  return config + (v.system_prompt?.length ?? 0);
}

export class KeptVersions {
  private readonly lru: SizedLru<PresetVersionDoc>;

  constructor(budgetChars = KEPT_CHARS) {
    this.lru = new SizedLru(budgetChars, KEPT_MAX_CHARS);
  }

  get(id: string): PresetVersionDoc | undefined {
    return this.lru.get(id);
  }

  add(v: PresetVersionDoc): void {
    this.lru.set(v._id, v, versionChars(v));
  }
}
