// What the HTTP layer needs, passed in rather than reached through globals.
import type { Client } from '@temporalio/client';
import type { Config } from '../config';
import type { Logger } from '../log';
import type { Store } from '../store';
import type { RateLimiter } from '../accounts/rate-limit';
import type { WorkspaceCache } from '../accounts/workspace-cache';
import type { KeyCache } from '../accounts/key-cache';
import type { UsageLedger } from '../accounts/usage-ledger';
import type { Upstreams } from '../routing/upstreams';
import type { DecisionExecution } from './decision-execution';
import type { Metrics } from '../metrics';

export interface AppDeps {
  config: Config;
  logger: Logger;
  store: Store;
  temporal: Client;
  /** How decisions run: in-process, or as workflows (DECISIONS_EXECUTION). */
  decisions: DecisionExecution;
  pingTemporal: (timeoutMs?: number) => Promise<void>;
  rateLimiter: RateLimiter;
  keys: KeyCache;
  workspaces: WorkspaceCache;
  upstreams: Upstreams;
  /** The one writer of usage records, shared with this process's activities. */
  usage: UsageLedger;
  /** The process's Prometheus metrics. */
  metrics: Metrics;
  /** Under `gateway start`: the state of each embedded process it supervises (for /readyz). */
  embedded?: () => Record<string, 'ok' | 'restarting'>;
}
