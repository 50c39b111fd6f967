// What the HTTP layer needs, passed in rather than reached through globals.
import type { Client } from '@temporalio/client';
import type { Config } from '../infrastructure/config';
import type { Logger } from '../infrastructure/log';
import type { Store } from '../infrastructure/store';
import type { RateLimiter } from '../domain/accounts/rate-limit';
import type { SpendAdmission } from '../domain/accounts/spend-admission';
import type { KeyCache } from '../domain/accounts/key-cache';
import type { UsageLedger } from '../domain/accounts/usage-ledger';
import type { Upstreams } from '../domain/routing/upstreams';
import type { DecisionExecution } from './decision-execution';
import type { Metrics } from '../infrastructure/metrics';
import type { Broadcaster } from '../domain/traces/broadcast';
import type { BatchBodyReader } from './batch-body';
import type { BodyMemory } from './body-memory';
import type { KeptVersions } from '../domain/presets/kept-versions';
import type { StorageQuota } from '../domain/accounts/storage-quota';

export interface AppDeps {
  config: Config;
  logger: Logger;
  store: Store;
  temporal: Client;
  /** How decisions run: in-process, or as workflows (DECISIONS_EXECUTION). */
  decisions: DecisionExecution;
  /** A round trip to the Temporal server (its caller bounds the wait). */
  pingTemporal: () => Promise<unknown>;
  /** Requests per key (RATE_LIMIT_REQUESTS). */
  rateLimiter: RateLimiter;
  /** Requests per workspace over all its keys (RATE_LIMIT_WORKSPACE_REQUESTS), keyed `requests:<workspace id>`. */
  workspaceRequests: RateLimiter;
  /** Batch creations per workspace (BATCH_CREATES_PER_MINUTE), keyed `batches:<workspace id>`. */
  batchCreates: RateLimiter;
  /** Pages of batches or keys listed per workspace (LIST_PAGES_PER_MINUTE), keyed `lists:<workspace id>`. */
  listPages: RateLimiter;
  /** Bytes of request bodies parsed here per workspace (BODY_BYTES_PER_MINUTE), in 64 KB units, keyed `bodies:<workspace id>`. */
  bodyBytes: RateLimiter;
  /** Bytes of batch results downloaded per workspace (RESULT_BYTES_PER_MINUTE), in 64 KB units, keyed `results:<workspace id>`. */
  resultBytes: RateLimiter;
  keys: KeyCache;
  workspaces: SpendAdmission;
  upstreams: Upstreams;
  /** The one writer of usage records, shared with this process's activities. */
  usage: UsageLedger;
  /** The process's Prometheus metrics. */
  metrics: Metrics;
  /** Sends generations to the trace destinations. */
  broadcast: Broadcaster;
  /** Reads batch create bodies, a large one on a worker thread. */
  batchBodies: BatchBodyReader;
  /** Counts the request bodies held in memory while they arrive (one workspace's at most its share). */
  bodyMemory: BodyMemory;
  /** What each workspace stores of batch inputs, preset versions and keys, and its quota (WORKSPACE_STORAGE_BYTES). */
  storage: StorageQuota;
  /** Preset versions this process has read (shared with its batch worker, if any). */
  presetVersions: KeptVersions;
  /** Under `gateway start`: the state of each embedded process it supervises (for /readyz). */
  embedded?: () => Record<string, 'ok' | 'restarting'>;
}
