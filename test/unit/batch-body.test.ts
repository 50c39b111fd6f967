// Batch create bodies read on a worker thread when large (api/batch-body.ts): the same result and
// the same refusals as reading in place, the event loop free meanwhile, and the lines packed in one
// buffer that round-trips any text.
import { expect } from 'chai';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import zlib from 'node:zlib';
import { BatchBodyReader, ReadTurns, readBatchBody } from '../../api/batch-body';
import { spoolDirectory, type SpooledBody } from '../../api/body-spool';
import { inflatedNow, mostBodyBytes } from '../../api/body';
import { BodyMemory } from '../../api/body-memory';
import { bodyBytes, lineCount, packLines, unpackLines } from '../../domain/batches/packed-lines';
import type { GatewayError } from '../../infrastructure/errors';

const limits = { maxDepth: 64, maxRequests: 50_000, maxBytes: 200 * 1024 * 1024, idleMs: 15_000 };

const line = (i: number, content = `question ${i}`) => ({
  custom_id: `c${i}`,
  body: { messages: [{ role: 'user', content }], max_tokens: 5 },
});
const bodyOf = (requests: unknown[], extra: Record<string, unknown> = {}) =>
  Buffer.from(JSON.stringify({ endpoint: '/v1/chat/completions', model: 'sandbox/chat-1', requests, ...extra }));

/** A body as the HTTP layer hands it over: in pieces of 64 KB, kept as the reader keeps them. */
async function received(reader: BatchBodyReader, raw: Buffer, encoding = 'identity'): Promise<SpooledBody> {
  const body = reader.spool(encoding);
  for (let at = 0; at < raw.length; at += 65_536) body.take(raw.subarray(at, at + 65_536));
  await body.end();
  return body;
}

async function refusal(p: Promise<unknown>): Promise<GatewayError> {
  try {
    await p;
  } catch (err) {
    return err as GatewayError;
  }
  throw new Error('expected a refusal');
}

describe('packed batch lines', () => {
  it('round-trip bodies of any text, multi-byte and empty-looking ones included, and know their sizes in bytes', () => {
    const lines = [
      { custom_id: 'a', body: '{}' },
      { custom_id: 'b', body: JSON.stringify({ content: 'é漢字😀 and "quotes"' }) },
      { custom_id: 'c', body: JSON.stringify({ content: 'x'.repeat(10_000) }) },
    ];
    const p = packLines(lines);
    expect(lineCount(p)).to.equal(3);
    expect(unpackLines(p, 0, 3)).to.deep.equal(lines.map((l, i) => ({ line: i, ...l })));
    expect(unpackLines(p, 1, 2)).to.deep.equal([{ line: 1, ...lines[1] }]);
    expect(bodyBytes(p, 1)).to.equal(Buffer.byteLength(lines[1].body));
    expect(bodyBytes(p, 0, 3)).to.equal(lines.reduce((n, l) => n + Buffer.byteLength(l.body), 0));
  });
});

describe('batch create bodies read on a worker thread', () => {
  let reader: BatchBodyReader;
  beforeEach(() => {
    reader = new BatchBodyReader(limits, 1024); // every body over 1 KB goes to the worker
  });
  afterEach(async () => {
    await reader.close();
  });

  it('reads a large body to the same result as in place, lines, checks and all', async () => {
    const requests = Array.from({ length: 2_000 }, (_, i) => line(i, `q${i} é漢字 ${'x'.repeat(i % 1200)}`));
    requests[7] = { custom_id: 'bad', body: { max_tokens: 5 } as never }; // no messages: counted, not refused
    const raw = bodyOf(requests, { metadata: { team: 'risk' } });
    expect(raw.length).to.be.above(1024 * 1024);
    const off = await reader.read(await received(reader, raw));
    const here = readBatchBody(raw, limits);
    expect(off.fields).to.deep.equal(here.fields);
    expect(off.validation).to.deep.equal({ invalid: 1, examples: ['bad (messages: is required)'] });
    expect(off.validation).to.deep.equal(here.validation);
    expect(unpackLines(off.lines, 0, 2_000)).to.deep.equal(unpackLines(here.lines, 0, 2_000));
    expect(JSON.parse(unpackLines(off.lines, 1999, 2000)[0].body)).to.deep.equal(requests[1999].body);
  });

  it('refuses on the worker as in place: the same status and message', async () => {
    const big = 'x'.repeat(4_000);
    const cases: [string, Buffer, number, RegExp][] = [
      ['not JSON', Buffer.concat([bodyOf([line(0, big)]), Buffer.from('}')]), 400, /^Request body is not valid JSON$/],
      ['__proto__', Buffer.from(`{"__proto__":{"a":1},"pad":"${big}"}`), 400, /forbidden key/],
      ['invalid UTF-8', Buffer.concat([Buffer.from(`{"pad":"${big}`), Buffer.from([0xff]), Buffer.from('"}')]), 400, /not valid UTF-8/],
      ['a bad envelope', bodyOf([line(0, big)], { completion_window: '0h' }), 400, /^completion_window: /],
      ['duplicate custom_ids', bodyOf([line(0, big), line(0, big)]), 422, /duplicate custom_id "c0"/],
      ['too many lines', bodyOf(Array.from({ length: 3 }, (_, i) => line(i, big))), 413, /3 lines, more than the limit of 2/],
      // 3 million characters, 9 MB as stored: a line's size is counted in bytes.
      [
        'a line over 8 MB as stored',
        bodyOf([{ custom_id: 'huge', body: { messages: [{ role: 'user', content: '漢'.repeat(3_000_000) }] } }]),
        413,
        /^requests\[0\]\.body: larger than 8 MB \(custom_id "huge"\)$/,
      ],
    ];
    const strict = new BatchBodyReader({ ...limits, maxRequests: 2 }, 1024);
    try {
      for (const [name, raw, status, message] of cases) {
        expect(raw.length, name).to.be.above(1024);
        const off = await refusal(strict.read(await received(strict, raw)));
        const here = await refusal((async () => readBatchBody(raw, { ...limits, maxRequests: 2 }))());
        expect(off.status, name).to.equal(status);
        expect(off.message, name).to.match(message);
        expect([off.status, off.message, off.metadata], name).to.deep.equal([here.status, here.message, here.metadata]);
      }
    } finally {
      await strict.close();
    }
  });

  // Judged against the in-place read on the same machine (a garbage collection of the 60 MB body is
  // a turn too): 57 ms against an in-place 1,320 ms failed a fixed 50 ms bound on a slow machine.
  it('keeps the event loop free while it reads: no turn over a tenth of what reading a 60 MB body in place holds it (~0.5 s)', async function () {
    this.timeout(60_000);
    const requests = Array.from({ length: 15_000 }, (_, i) => line(i, 'x'.repeat(4_000)));
    const raw = bodyOf(requests);
    const started = performance.now();
    readBatchBody(raw, limits);
    const inPlace = performance.now() - started;
    let longest = 0;
    let last = performance.now();
    const ticker = setInterval(() => {
      const now = performance.now();
      longest = Math.max(longest, now - last);
      last = now;
    }, 2);
    try {
      const read = await reader.read(await received(reader, raw));
      expect(lineCount(read.lines)).to.equal(15_000);
    } finally {
      clearInterval(ticker);
    }
    expect(inPlace, 'reading in place holds the event loop').to.be.above(150);
    expect(longest, `longest turn while read on the worker (in place: ${inPlace.toFixed(0)} ms)`).to.be.below(inPlace / 10);
  });

  it('holds large bodies for a workspace up to three quarters of four of the largest, and for the process up to four; small ones always; each given back once', () => {
    const budgeted = new BatchBodyReader({ ...limits, maxBytes: 10_000 }, 1024); // spool: 40,000, a workspace's share 30,000
    const small = budgeted.reserve('a', 1024); // kept in memory and read in place: not counted
    const held = [budgeted.reserve('a', 10_000), budgeted.reserve('a', 10_000), budgeted.reserve('a', 10_000)];
    let refused: any = null;
    try {
      budgeted.reserve('a', 2048);
    } catch (err) {
      refused = err;
    }
    expect(refused?.status).to.equal(429);
    expect(refused.retryAfterSeconds).to.equal(5);
    expect(refused.message).to.match(/This workspace is sending other large batches/);
    expect(budgeted.reserve('a', 1024)).to.be.a('function');
    // Another workspace still has room for a body of the largest size.
    const other = budgeted.reserve('b', 10_000);
    expect(() => budgeted.reserve('c', 2048)).to.throw(/This process is receiving other large batches/);
    held[0]();
    held[0](); // twice: still once
    const again = budgeted.reserve('c', 10_000);
    expect(() => budgeted.reserve('b', 2048)).to.throw(/This process is receiving other large batches/);
    for (const done of [...held.slice(1), other, again, small]) done();
    expect(budgeted.reserve('a', 10_000)).to.be.a('function');
    expect(budgeted.reserve('b', 10_000)).to.be.a('function');
  });

  it('counts bodies held in memory: a workspace up to three quarters of 64 of the largest, the process up to 64', () => {
    const memory = new BodyMemory(1_000); // budget 64,000, a workspace's share 48,000
    memory.add('a', 40_000);
    memory.add('a', 8_000);
    expect(() => memory.add('a', 1)).to.throw(/This workspace is sending more request bodies/);
    memory.add('b', 16_000);
    expect(() => memory.add('c', 1)).to.throw(/This process is receiving too many request bodies/);
    memory.release('a', 48_000);
    memory.add('c', 48_000);
    expect(() => memory.add('a', 1)).to.throw(/This process is receiving too many/);
    memory.release('b', 16_000);
    memory.add('a', 16_000);
  });

  it('reads bodies that have arrived up to a budget of bytes at once (one always), in the order they arrived', async () => {
    const turns = new ReadTurns(10_000);
    const order: string[] = [];
    const big = await turns.take(50_000); // over the budget, but alone: taken
    const waiting = [
      turns.take(6_000).then((done) => (order.push('a'), done)),
      turns.take(1_000).then((done) => (order.push('b'), done)), // would fit, but waits its turn behind a
    ];
    await new Promise((r) => setTimeout(r, 20));
    expect(order).to.deep.equal([]);
    big();
    big(); // twice: given back once
    const [a, b] = await Promise.all(waiting);
    expect(order).to.deep.equal(['a', 'b']);
    let third = false;
    const c = turns.take(4_000).then((done) => ((third = true), done)); // 6,000 + 1,000 + 4,000: over
    await new Promise((r) => setTimeout(r, 20));
    expect(third).to.equal(false);
    a();
    (await c)();
    b();
  });

  it('keeps a body in memory up to its threshold, past it in a file that discarding removes', async () => {
    const raw = bodyOf(Array.from({ length: 50 }, (_, i) => line(i, 'x'.repeat(100))));
    const roomy = new BatchBodyReader(limits, raw.length);
    const small = await received(roomy, raw);
    await roomy.close();
    expect([small.file, small.bytes, Buffer.concat(small.chunks).equals(raw)]).to.deep.equal([null, raw.length, true]);
    const big = await received(reader, raw);
    expect(big.file).to.be.a('string');
    expect(big.chunks).to.deep.equal([]);
    expect(fs.readFileSync(big.file!).equals(raw)).to.equal(true);
    big.discard();
    await new Promise((r) => setTimeout(r, 50));
    expect(fs.existsSync(big.file!)).to.equal(false);
  });

  it('refuses a body that cannot be written (its directory gone) with a 503', async () => {
    const body = reader.spool();
    fs.rmSync(body.dir, { recursive: true });
    const refused = await refusal(
      (async () => {
        for (let i = 0; i < 64; i++) {
          if (!body.take(Buffer.alloc(65_536, 0x20))) await new Promise<void>((r) => body.onDrain(r));
        }
        await body.end();
      })(),
    );
    expect([refused.status, refused.message]).to.deep.equal([503, 'The request body could not be stored right now; try again']);
    body.discard();
  });

  it('removes the body directories of processes that are gone (a crash leaves its bodies), not those of live ones', () => {
    const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'spool-test-'));
    try {
      const gone = spawnSync(process.execPath, ['-e', '0']).pid;
      const stale = path.join(tmp, `inference-gateway-batch-bodies-${gone}-abc`);
      const live = path.join(tmp, `inference-gateway-batch-bodies-${process.ppid}-def`);
      for (const dir of [stale, live]) {
        fs.mkdirSync(dir);
        fs.writeFileSync(path.join(dir, '0.body'), '{}');
      }
      const own = spoolDirectory(tmp);
      expect(path.basename(own)).to.match(new RegExp(`^inference-gateway-batch-bodies-${process.pid}-`));
      expect(fs.readdirSync(tmp).sort()).to.deep.equal([path.basename(live), path.basename(own)].sort());
    } finally {
      fs.rmSync(tmp, { recursive: true, force: true });
    }
  });

  it('reads compressed bodies on the worker, decoded no further than the limit', async () => {
    const raw = bodyOf(Array.from({ length: 30 }, (_, i) => line(i)));
    for (const [encoding, encode] of [
      ['gzip', zlib.gzipSync],
      ['deflate', zlib.deflateSync],
      ['br', zlib.brotliCompressSync],
    ] as const) {
      const read = await reader.read(await received(reader, encode(raw), encoding));
      expect(unpackLines(read.lines, 0, 30), encoding).to.deep.equal(unpackLines(readBatchBody(raw, limits).lines, 0, 30));
    }
    const bomb = zlib.gzipSync(Buffer.alloc(20_000, 0x20));
    const tooBig = await refusal((async () => inflatedNow(bomb, 'gzip', 10_000))());
    expect([tooBig.status, tooBig.message]).to.deep.equal([413, 'Request body is larger than the configured limit']);
    const strict = new BatchBodyReader({ ...limits, maxBytes: 10_000 }, 1024);
    try {
      expect((await refusal(strict.read(await received(strict, bomb, 'gzip')))).status).to.equal(413);
    } finally {
      await strict.close();
    }
    const fake = await refusal(reader.read(await received(reader, raw, 'gzip')));
    expect([fake.status, fake.message]).to.deep.equal([400, 'Request body is not valid gzip data']);
  });

  it('counts a body by its Content-Length (compressed ones too: kept as sent), else by the limit', () => {
    const req = (headers: Record<string, string>) => ({ headers }) as never;
    expect(mostBodyBytes(req({ 'content-length': '5000' }), 10_000)).to.equal(5000);
    expect(mostBodyBytes(req({ 'content-length': '5000', 'content-encoding': 'Identity ' }), 10_000)).to.equal(5000);
    expect(mostBodyBytes(req({ 'content-length': '5000', 'content-encoding': 'gzip' }), 10_000)).to.equal(5000);
    expect(mostBodyBytes(req({ 'transfer-encoding': 'chunked' }), 10_000)).to.equal(10_000);
    expect(mostBodyBytes(req({ 'content-length': '50000' }), 10_000)).to.equal(10_000); // refused at the limit anyway
  });

  it('a read in flight when the reader closes is finished first: the worker is asked to end, not terminated (before: a 503, and now and then the whole process aborted); the next read starts a new worker', async () => {
    const raw = bodyOf(Array.from({ length: 5_000 }, (_, i) => line(i, 'x'.repeat(2_000))));
    const body = await received(reader, raw);
    let readAt = 0;
    const pending = reader.read(body).then((read) => ((readAt = performance.now()), read));
    await reader.close();
    const closedAt = performance.now();
    expect(lineCount((await pending).lines)).to.equal(5_000);
    expect(readAt, 'answered before the close ended').to.be.above(0).and.at.most(closedAt);
    expect(lineCount((await reader.read(await received(reader, raw))).lines)).to.equal(5_000);
  });

  it('stores the lines of a large body on the worker: a database it cannot reach is a 503 (as on the API thread), not a crash', async function () {
    this.timeout(20_000);
    // Nothing listens on port 1: the worker's connection gives up after its server selection (3 s).
    const away = new BatchBodyReader({ ...limits, database: { uri: 'mongodb://127.0.0.1:1/', name: 'unreachable' } }, 1024);
    try {
      const lines = packLines(Array.from({ length: 200 }, (_, i) => ({ custom_id: `c${i}`, body: JSON.stringify(line(i).body) })));
      const err = await refusal(away.writeInputs(null as never, { _id: 'batch_x' }, lines, 100)); // the API's store is not used
      expect(err.status, String(err)).to.equal(503);
      expect(err.message).to.equal('The database is unavailable right now; try again shortly');
    } finally {
      await away.close();
    }
  });
});
