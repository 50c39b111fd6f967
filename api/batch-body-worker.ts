// The worker thread of api/batch-body.ts: reads each large (or compressed) batch create body it is
// sent, from its file or as its bytes, and answers with the result (its packed line bodies moved
// back) or the refusal.
import fs from 'node:fs';
import { parentPort, workerData } from 'node:worker_threads';
import { GatewayError } from '../infrastructure/errors';
import { readBatchBody, type BatchBodyLimits, type ToWorker, type WorkerAnswer } from './batch-body';
import { inflatedNow } from './body';

const limits = workerData as BatchBodyLimits;

parentPort!.on('message', (m: ToWorker) => {
  let answer: WorkerAnswer;
  try {
    const sent = 'file' in m ? fs.readFileSync(m.file) : m.bytes;
    const read = readBatchBody(inflatedNow(sent, m.encoding, limits.maxBytes), limits);
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
