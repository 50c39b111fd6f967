// The worker thread of api/batch-body.ts: gathers each large batch create body it is sent in
// pieces, reads it, and answers with the result (its packed line bodies moved back) or the refusal.
import { parentPort, workerData } from 'node:worker_threads';
import { GatewayError } from '../infrastructure/errors';
import { readBatchBody, type BatchBodyLimits, type ToWorker, type WorkerAnswer } from './batch-body';

const limits = workerData as BatchBodyLimits;
const bodies = new Map<number, Uint8Array[]>();

parentPort!.on('message', (m: ToWorker) => {
  if ('piece' in m) {
    const pieces = bodies.get(m.id) ?? [];
    pieces.push(m.piece);
    bodies.set(m.id, pieces);
    return;
  }
  const raw = Buffer.concat(bodies.get(m.id) ?? []);
  bodies.delete(m.id);
  let answer: WorkerAnswer;
  try {
    const read = readBatchBody(raw, limits);
    parentPort!.postMessage({ id: m.id, read } satisfies WorkerAnswer, [read.lines.bodies.buffer as ArrayBuffer]);
    return;
  } catch (err) {
    answer =
      err instanceof GatewayError
        ? { id: m.id, error: { status: err.status, message: err.message, metadata: err.metadata } }
        : { id: m.id, crash: String((err as Error)?.stack ?? err) };
  }
  parentPort!.postMessage(answer);
});
