// Which driver errors mean "the database cannot be reached now" (a 503, and a known key served as
// last read) rather than a defect (a 500). A pool cleared under an operation when the server stopped
// answering is a MongoNetworkError subclass named PoolClearedOnNetworkError: seen as a 500 before.
import { expect } from 'chai';
import { MongoBulkWriteError, MongoNetworkError, MongoNetworkTimeoutError, MongoServerError, MongoServerSelectionError } from 'mongodb';
import { isDatabaseFull, isDatabaseUnavailable } from '../../infrastructure/store';

const emptyResult = {
  insertedCount: 0,
  matchedCount: 0,
  modifiedCount: 0,
  deletedCount: 0,
  upsertedCount: 0,
  upsertedIds: {},
  insertedIds: {},
} as never;

describe('database errors', () => {
  it('tells an unreachable database from any other error', () => {
    class PoolClearedOnNetworkError extends MongoNetworkError {
      override get name() {
        return 'PoolClearedOnNetworkError';
      }
    }
    for (const err of [
      new MongoNetworkError('connection reset'),
      new MongoNetworkTimeoutError('timed out'),
      new PoolClearedOnNetworkError('pool cleared'),
      new MongoServerSelectionError('no server', { type: 'Unknown', servers: new Map() } as never),
      Object.assign(new Error('waited'), { name: 'MongoWaitQueueTimeoutError' }),
      // insertMany wraps a lost connection in a bulk write error with no write errors (seen in CI).
      new MongoBulkWriteError(new PoolClearedOnNetworkError('interrupted'), emptyResult),
    ])
      expect(isDatabaseUnavailable(err), err.name).to.equal(true);
    const duplicate = new MongoServerError({ message: 'E11000 duplicate key', code: 11000 });
    const refused = new MongoBulkWriteError(
      { message: 'refused', code: 2, writeErrors: [{ index: 0, code: 2, errmsg: 'refused' }] } as never,
      emptyResult,
    );
    for (const err of [duplicate, refused, new Error('boom'), null, 'text'])
      expect(isDatabaseUnavailable(err), String(err)).to.equal(false);
  });

  it('tells a database whose disk is full, as FerretDB and MongoDB say it, from other refusals', () => {
    // As the embedded FerretDB answered an insert and an update with its disk full (probed).
    const sqlite = '[msg_insert.go:168 handler.(*Handler).MsgInsert] [db.go:167 fsql.(*DB).InTransaction] database or disk is full (13)';
    const full = [
      new MongoServerError({ message: sqlite, code: 1 }),
      new MongoBulkWriteError({ message: sqlite, code: 1, writeErrors: [{ index: 0, code: 1, errmsg: sqlite }] } as never, emptyResult),
      new MongoServerError({ message: 'could not extend file "base/16384/2619": No space left on device', code: 1 }),
      new MongoServerError({ message: 'Out of disk space', code: 14031 }),
    ];
    for (const err of full) expect(isDatabaseFull(err), err.message).to.equal(true);
    const duplicate = new MongoServerError({ message: 'E11000 duplicate key', code: 11000 });
    for (const err of [duplicate, new MongoNetworkError('connection reset'), new Error('boom'), null, 'text'])
      expect(isDatabaseFull(err), String(err)).to.equal(false);
  });
});
