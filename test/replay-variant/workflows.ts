// A batch workflow changed the way a careless edit would (a new first step, not behind `patched`):
// test/replay.test.ts replays the recorded histories against it and expects a determinism error,
// so that test is known to fail on a change that would break runs in flight.
import { proxyActivities } from '@temporalio/workflow';
import type { Activities } from '../../activities';

const bookkeeping = proxyActivities<Activities>({ startToCloseTimeout: '1 minute' });

export async function batchWorkflow(input: { batchId: string }): Promise<string> {
  await bookkeeping.setBatchStatus(input.batchId, 'validating');
  await bookkeeping.validateBatchLines(input.batchId);
  return 'changed';
}

export { decisionWorkflow } from '../../workflows/decision';
