// The least a decision can cost in Temporal: one workflow whose only step is a local activity that
// does nothing, reporting through a sink as the decision workflow does. No auth, no database, no
// provider. Deterministic code only, like workflows/.
import { proxyLocalActivities, proxySinks, type Sinks } from '@temporalio/workflow';

export interface FloorSinks extends Sinks {
  floor: { done(id: string): void };
}

const { echo } = proxyLocalActivities<{ echo(id: string): Promise<string> }>({ startToCloseTimeout: '1 minute' });
const { floor } = proxySinks<FloorSinks>();

export async function floorWorkflow(id: string): Promise<string> {
  const r = await echo(id);
  floor.done(id);
  return r;
}
