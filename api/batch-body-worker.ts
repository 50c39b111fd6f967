// The worker thread of api/batch-body.ts: reads each large (or compressed) batch create body it is
// sent, from its file or as its bytes, and answers with the result (its packed line bodies moved
// back) or the refusal; stores the lines of such a body once the API has started its batch, with a
// database connection of its own.
import fs from 'node:fs';
import { parentPort, workerData } from 'node:worker_threads';
import { storeInputs } from '../domain/batches/inputs';
import { GatewayError, InternalError } from '../infrastructure/errors';
import { Store } from '../infrastructure/store';
import { readBatchBody, type ToWorker, type WorkerAnswer, type WorkerSettings } from './batch-body';
import { inflatedNow } from './body';
import { normalize } from './errors';

const { database, ...limits } = workerData as WorkerSettings;

/** Connected at the first store; a failed connection is tried again by the next. */
let connecting: Promise<Store> | null = null;
function connected(): Promise<Store> {
  if (!database) return Promise.reject(new Error('the batch body worker was started without a database'));
  if (!connecting) {
    connecting = Store.connect(database.uri, database.name);
    connecting.catch(() => (connecting = null));
  }
  return connecting;
}

/** A refusal (a database that is away or full is a 503, as everywhere), or a defect as its stack. */
function failure(id: number, err: unknown): WorkerAnswer {
  const e = normalize(err);
  if (e instanceof InternalError && !(err instanceof GatewayError)) return { id, crash: String((err as Error)?.stack ?? err) };
  return { id, error: { status: e.status, message: e.message, metadata: e.metadata } };
}

/** Stores under way: a close waits for them. */
const storing = new Set<Promise<void>>();

/** Ends the thread once idle: its loop runs out once the port and the database connection are closed. */
async function closeWhenDone(): Promise<void> {
  await Promise.all(storing);
  const store = await connecting?.catch(() => null);
  await store?.close().catch(() => undefined);
  parentPort!.close();
}

parentPort!.on('message', (m: ToWorker) => {
  if ('close' in m) {
    void closeWhenDone();
    return;
  }
  if ('store' in m) {
    const { batch, lines, chunkSize } = m.store;
    const stored = connected()
      .then((store) => storeInputs(store, batch, lines, chunkSize))
      .then(
        (starts) => parentPort!.postMessage({ id: m.id, starts } satisfies WorkerAnswer),
        (err) => parentPort!.postMessage(failure(m.id, err)),
      )
      .finally(() => storing.delete(stored));
    storing.add(stored);
    return;
  }
  try {
    const sent = 'file' in m ? fs.readFileSync(m.file) : m.bytes;
    const read = readBatchBody(inflatedNow(sent, m.encoding, limits.maxBytes), limits);
    parentPort!.postMessage({ id: m.id, read } satisfies WorkerAnswer, [read.lines.bodies.buffer as ArrayBuffer]);
  } catch (err) {
    parentPort!.postMessage(failure(m.id, err));
  }
});
