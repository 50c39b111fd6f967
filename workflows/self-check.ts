import { proxyActivities, workflowInfo } from '@temporalio/workflow';
import type { Activities } from '../activities';

const { writeProbe, readProbe } = proxyActivities<Activities>({
  startToCloseTimeout: '10 seconds',
  retry: { maximumAttempts: 3 },
});

/**
 * End-to-end self check (`gateway check`, and the wiring test): proves a client can start a
 * workflow whose activities reach MongoDB through a running worker.
 */
export async function selfCheckWorkflow(note: string): Promise<{ id: string; note: string }> {
  const id = workflowInfo().workflowId;
  await writeProbe(id, note);
  return readProbe(id);
}
