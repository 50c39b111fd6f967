// Names shared by workflows, the worker and clients. Importable from workflow code (no I/O).
import { defineSearchAttributeKey } from '@temporalio/common';
import { defineQuery } from '@temporalio/workflow';

/** The ApplicationFailure type of a gateway error: never retried, turned back into its HTTP status by the API. */
export const GATEWAY_ERROR_TYPE = 'GatewayError';

/** Custom search attributes the batch workflow keeps current, registered when the dev server starts. */
export const searchAttributes = {
  workspace: defineSearchAttributeKey('GatewayWorkspace', 'KEYWORD'),
  batchStatus: defineSearchAttributeKey('GatewayBatchStatus', 'KEYWORD'),
  model: defineSearchAttributeKey('GatewayModel', 'KEYWORD'),
} as const;

/** Temporal's built-in query behind the Web UI's "current details" (what `setCurrentDetails` set). */
export const workflowMetadataQuery = defineQuery<{ currentDetails?: string }>('__temporal_workflow_metadata');
