// Measures the Temporal floor under the gateway's decisions on the same server: eager start on a
// shared NativeConnection, one no-op local activity, the result handed back in-process. What the
// gateway adds above this is its own work (auth, limits, validation, provider call, usage record).
import { Client } from '@temporalio/client';
import { DefaultLogger, NativeConnection, Runtime, Worker, makeTelemetryFilterString, type InjectedSinks } from '@temporalio/worker';
import type { FloorSinks } from './workflows';

export async function measureTemporalFloor(address: string, warmup: number, total: number): Promise<{ p50_ms: number; p99_ms: number }> {
  // Keep the SDK's narration out of the report (the runtime can be installed once per process).
  try {
    Runtime.install({
      logger: new DefaultLogger('WARN'),
      telemetryOptions: { logging: { filter: makeTelemetryFilterString({ core: 'WARN' }), forward: {} } },
    });
  } catch {
    /* already installed */
  }
  const connection = await NativeConnection.connect({ address });
  const client = new Client({ connection });
  const waiting = new Map<string, () => void>();
  const sinks: InjectedSinks<FloorSinks> = { floor: { done: { fn: (_info, id) => waiting.get(id)?.(), callDuringReplay: false } } };
  const taskQueue = `floor-${Date.now()}`;
  const worker = await Worker.create({
    connection,
    taskQueue,
    workflowsPath: require.resolve('./workflows'),
    sinks,
    activities: { echo: async (id: string) => id },
  });
  const running = worker.run();
  try {
    const latencies: number[] = [];
    for (let i = 0; i < warmup + total; i++) {
      const id = `floor-${i}-${Date.now()}`;
      const t0 = performance.now();
      const done = new Promise<void>((resolve) => waiting.set(id, resolve));
      const handle = await client.workflow.start('floorWorkflow', { workflowId: id, taskQueue, requestEagerStart: true, args: [id] });
      await (handle.eagerlyStarted ? done : handle.result());
      waiting.delete(id);
      if (i >= warmup) latencies.push(performance.now() - t0);
    }
    latencies.sort((a, b) => a - b);
    const at = (q: number) => Math.round(latencies[Math.min(latencies.length - 1, Math.ceil(q * latencies.length) - 1)] * 100) / 100;
    return { p50_ms: at(0.5), p99_ms: at(0.99) };
  } finally {
    worker.shutdown();
    await running;
    await connection.close();
  }
}
