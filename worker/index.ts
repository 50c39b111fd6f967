// The Temporal worker: runs workflows/ and the activities built from the store and HTTP clients.
import { NativeConnection, Worker } from '@temporalio/worker';
import { createActivities, type ActivityDeps } from '../activities';
import type { DecisionHandoff } from '../temporal/decision-handoff';

export interface WorkerOptions extends ActivityDeps {
  connection: NativeConnection;
  namespace: string;
  taskQueue: string;
  /** Where finished decisions are handed to this process's HTTP handlers. */
  handoff: DecisionHandoff;
}

export async function createWorker(opts: WorkerOptions): Promise<Worker> {
  return Worker.create({
    connection: opts.connection,
    namespace: opts.namespace,
    taskQueue: opts.taskQueue,
    workflowsPath: require.resolve('../workflows'),
    activities: createActivities({ store: opts.store, upstreams: opts.upstreams, batchSettings: opts.batchSettings }),
    sinks: opts.handoff.sinks(),
  });
}
