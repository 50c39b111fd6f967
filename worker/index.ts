// The Temporal workers: one runs workflows/ and the activities built (by `createActivities`) from the
// store and HTTP clients; the other, webhook deliveries alone, on their own queue (workflows/shared.ts).
import { NativeConnection, Worker } from '@temporalio/worker';
import { asyncLocalStorage } from '@temporalio/activity';
import { checkActivityContext } from '../infrastructure/temporal/activity-context';
import type { Activities } from '../activities';
import { webhookTaskQueue } from '../workflows/shared';
import { workflowBundle } from './bundle';

export interface WorkerOptions {
  connection: NativeConnection;
  namespace: string;
  taskQueue: string;
  /** Built once per process by `createActivities`; the API's inline decisions call the same functions. */
  activities: Activities;
}

export async function createWorker(opts: WorkerOptions): Promise<Worker> {
  checkActivityContext(asyncLocalStorage);
  return Worker.create({
    connection: opts.connection,
    namespace: opts.namespace,
    taskQueue: opts.taskQueue,
    workflowBundle: await workflowBundle(),
    activities: opts.activities,
    // Heartbeats carry cancellation back to a running chunk: let one reach the server every second,
    // so a cancelled batch stops calling providers within about a second.
    maxHeartbeatThrottleInterval: '1 second',
    // A workflow task waits this long on the queue of the worker that last ran the workflow before
    // any worker may take it. The SDK's 10 s default stalls every batch a killed worker held for 10 s
    // more; 3 s still covers a busy worker, and a task taken elsewhere only costs a history replay.
    stickyQueueScheduleToStartTimeout: '3 seconds',
  });
}

/** Delivers batch webhooks: activities only, so a receiver that never answers holds none of the other worker's slots. */
export function createWebhookWorker(opts: WorkerOptions): Promise<Worker> {
  return Worker.create({
    connection: opts.connection,
    namespace: opts.namespace,
    taskQueue: webhookTaskQueue(opts.taskQueue),
    activities: { deliverBatchWebhook: opts.activities.deliverBatchWebhook },
  });
}
