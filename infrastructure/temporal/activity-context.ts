// The Temporal SDK's activity context (`Context.current()`) kept in a SyncScope, not in the
// AsyncLocalStorage the SDK would make (sync-scope.ts says why). @temporalio/activity takes the
// store it finds under its global key, which lets several copies of the package share one, when it
// is first loaded: so this module is loaded before any Temporal package, as the first import of the
// process's entry (cli/index.ts, and test/fixture.ts for the tests), and the worker checks that the
// SDK took it (`checkActivityContext`). Activities read their context as they start
// (activities/batches.ts): after their first `await` there is none.
import type { Context } from '@temporalio/activity';
import { SyncScope } from './sync-scope';

const activityContext = new SyncScope<Context>();

const KEY = Symbol.for('__temporal_activity_context_storage__');
const slots = globalThis as unknown as Record<symbol, unknown>;
slots[KEY] ??= activityContext;

/** Throws unless `sdkStore` (the SDK's `asyncLocalStorage`) is ours: a worker would otherwise turn on promise hooks. */
export function checkActivityContext(sdkStore: unknown): void {
  if (sdkStore !== activityContext)
    throw new Error(
      "@temporalio/activity was loaded before infrastructure/temporal/activity-context: import that first in the process's entry",
    );
}
