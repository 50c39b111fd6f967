// Activities hold all I/O. They are built by a factory from their dependencies and are idempotent:
// a retry after a crash rewrites the same `_id`, never a second document.
import type { Store } from '../store';
import type { UsageLedger } from '../accounts/usage-ledger';
import type { Upstreams } from '../routing/upstreams';
import { createProbeActivities } from './probe';
import { createDecisionActivities } from './decisions';
import { createBatchActivities } from './batches';
import type { Config } from '../config';
import type { Metrics } from '../metrics';
import type { WebhookSender } from '../webhooks/deliver';

export type { DecisionJob, DecisionResult } from './decisions';

export interface ActivityDeps {
  store: Store;
  upstreams: Upstreams;
  batchSettings: Config['batches'];
  /** The one writer of usage records (group commit). */
  usage: UsageLedger;
  metrics?: Metrics;
  webhooks?: { sender: WebhookSender; timeoutMs: number };
}

export function createActivities(deps: ActivityDeps) {
  return {
    ...createProbeActivities(deps),
    ...createDecisionActivities(deps),
    ...createBatchActivities(deps),
  };
}

export type Activities = ReturnType<typeof createActivities>;
