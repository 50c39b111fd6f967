// Activities hold all I/O. They are built by a factory from their dependencies and are idempotent:
// a retry after a crash rewrites the same `_id`, never a second document.
import { createProbeActivities } from './probe';
import { createDecisionActivities } from './decisions';
import { createBatchActivities, type BatchDeps } from './batches';
import type { DecisionHandoff } from '../infrastructure/temporal/decision-handoff';

export type { DecisionJob, DecisionResult } from './decisions';

/** The batch activities need the most; the others take what they use of the same. */
export type ActivityDeps = BatchDeps & { handoff?: DecisionHandoff };

export function createActivities(deps: ActivityDeps) {
  return {
    ...createProbeActivities(deps),
    ...createDecisionActivities(deps),
    ...createBatchActivities(deps),
  };
}

export type Activities = ReturnType<typeof createActivities>;
