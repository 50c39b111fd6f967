// Names shared by workflows, the worker and clients. Importable from workflow code (no I/O).
import { ApplicationFailure, defineSearchAttributeKey } from '@temporalio/common';
import { defineQuery } from '@temporalio/workflow';

/** The ApplicationFailure type of a gateway error: never retried, turned back into its HTTP status by the API. */
export const GATEWAY_ERROR_TYPE = 'GatewayError';

/** What a gateway error's failure carries, for the API to answer with (infrastructure/temporal/failures.ts). */
export interface GatewayFailureDetails {
  status: number;
  metadata: Record<string, unknown> | null;
  retryAfterSeconds?: number;
}

/** A gateway error as it crosses Temporal, from an activity or from workflow code. */
export function gatewayFailure(message: string, details: GatewayFailureDetails): ApplicationFailure {
  return ApplicationFailure.create({ type: GATEWAY_ERROR_TYPE, message, nonRetryable: true, details: [details] });
}

/** The ApplicationFailure type of a batch that was never created (its document never stored): its workflow ends. */
export const BATCH_NOT_CREATED = 'BatchNotCreated';

/**
 * The task queue of webhook deliveries, beside the workers' own. An attempt can wait its whole
 * timeout on a receiver that never answers, and on the workers' queue it held an activity slot
 * meanwhile: 150 such deliveries of one workspace held all 100, and another workspace's batch
 * took 3.7 times as long. Here they only wait for each other.
 */
export const webhookTaskQueue = (taskQueue: string): string => `${taskQueue}-webhooks`;

/** Custom search attributes the batch workflow keeps current, registered when the dev server starts. */
export const searchAttributes = {
  workspace: defineSearchAttributeKey('GatewayWorkspace', 'KEYWORD'),
  batchStatus: defineSearchAttributeKey('GatewayBatchStatus', 'KEYWORD'),
  model: defineSearchAttributeKey('GatewayModel', 'KEYWORD'),
} as const;

/** Temporal's built-in query behind the Web UI's "current details" (what `setCurrentDetails` set). */
export const workflowMetadataQuery = defineQuery<{ currentDetails?: string }>('__temporal_workflow_metadata');
