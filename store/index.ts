// The MongoDB connection and the collections the gateway keeps. FerretDB (the embedded default)
// has no transactions and scans everything but `_id` lookups, so writes are idempotent by `_id`.
import { MongoClient, type Db, type Document, type Collection } from 'mongodb';

export interface ProbeDoc extends Document {
  _id: string;
  note: string;
  written_at: Date;
}

export class Store {
  private constructor(readonly client: MongoClient, readonly db: Db) {}

  static async connect(uri: string, database: string): Promise<Store> {
    const client = new MongoClient(uri, {
      serverSelectionTimeoutMS: 5_000,
      connectTimeoutMS: 5_000,
      // FerretDB has no sessions/transactions; a standalone needs no retryable-write txn numbers.
      retryWrites: false,
      appName: 'inference-gateway',
    });
    await client.connect();
    return new Store(client, client.db(database));
  }

  get probes(): Collection<ProbeDoc> {
    return this.db.collection<ProbeDoc>('probes');
  }

  /** Round trip to the server, bounded so a dead database answers quickly. */
  async ping(timeoutMs = 2_000): Promise<void> {
    await withTimeout(this.db.command({ ping: 1 }), timeoutMs, 'MongoDB ping timed out');
  }

  async close(): Promise<void> {
    await this.client.close();
  }
}

export async function withTimeout<T>(p: Promise<T>, ms: number, message: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      p,
      new Promise<never>((_, reject) => { timer = setTimeout(() => reject(new Error(message)), ms); }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}
