import { expect } from 'chai';
import { Writable } from 'node:stream';
import { boundedLines } from '../../infrastructure/log/stdout';

/** A stdout whose reader can stop: writes complete only while `reading`. */
function pipeLike() {
  const writes: string[] = [];
  let held: (() => void)[] = [];
  let reading = true;
  const out = new Writable({
    highWaterMark: 100,
    write(chunk: Buffer, _enc, done) {
      writes.push(chunk.toString());
      if (reading) done();
      else held.push(done);
    },
  });
  return {
    out,
    writes,
    stop: () => (reading = false),
    resume: () => {
      reading = true;
      for (const done of held.splice(0)) done();
      held = [];
    },
  };
}

const turn = () => new Promise((r) => setImmediate(r));

describe('log lines to stdout', () => {
  it('writes the lines of one event-loop turn in one write, in order', async () => {
    const { out, writes } = pipeLike();
    const lines = boundedLines(out, 64 * 1024);
    for (let i = 0; i < 5; i++) lines.write(`{"n":${i}}\n`);
    expect(writes).to.have.length(0); // not before the turn ends
    await turn();
    expect(writes).to.deep.equal(['{"n":0}\n{"n":1}\n{"n":2}\n{"n":3}\n{"n":4}\n']);
  });

  it('writes a turn of more than a pipe takes whole as writes of whole lines of at most 1,365 characters, one at a time; a longer line alone', async () => {
    const pipe = pipeLike();
    const lines = boundedLines(pipe.out, 1024 * 1024);
    const line = (n: number, size = 100) => `{"n":${n},"pad":"${'x'.repeat(size - 20 - String(n).length)}"}\n`;
    const sent = [...Array.from({ length: 30 }, (_, i) => line(i)), line(30, 5_000), line(31)];
    pipe.stop();
    for (const l of sent) lines.write(l);
    await turn();
    // One write at a time: the next waits until the reader takes the last.
    expect(pipe.writes).to.have.length(1);
    for (let i = 0; i < 10; i++) {
      pipe.resume();
      pipe.stop();
      await turn();
    }
    pipe.resume();
    await turn();
    expect(pipe.writes.join('')).to.equal(sent.join(''));
    for (const w of pipe.writes) {
      expect(w.endsWith('\n'), 'whole lines').to.equal(true);
      if (w.length > 1_365) expect(w.split('\n')).to.have.length(2); // one long line, alone
    }
    expect(pipe.writes.length).to.be.at.least(4);
    expect(pipe.writes).to.include(line(30, 5_000)); // the long line, a write of its own
  });

  it('drops lines past the bound while the reader has stopped, and reports how many once it reads again', async () => {
    const pipe = pipeLike();
    const lines = boundedLines(pipe.out, 1000);
    const reports: number[] = [];
    lines.onResumed((n) => reports.push(n));
    pipe.stop();
    const line = `${'x'.repeat(99)}\n`; // 100 bytes
    for (let i = 0; i < 30; i++) {
      lines.write(line);
      await turn();
    }
    // What waits never passes the bound: 10 lines of 100 bytes were taken, 20 dropped.
    expect(pipe.out.writableLength).to.be.at.most(1000);
    expect(pipe.writes.join('').length + pipe.out.writableLength).to.be.at.most(1000 + 100);
    expect(reports).to.deep.equal([]);
    const drained = new Promise((r) => pipe.out.once('drain', r));
    pipe.resume();
    await drained;
    await turn();
    expect(reports).to.deep.equal([20]);
    lines.write('{"after":true}\n');
    await turn();
    expect(pipe.writes.at(-1)).to.equal('{"after":true}\n');
  });

  it('stops writing once the reader is gone (EPIPE), without an unhandled error', async () => {
    const out = new Writable({
      write(_chunk, _enc, done) {
        done(Object.assign(new Error('write EPIPE'), { code: 'EPIPE' }));
      },
    });
    let written = 0;
    const origWrite = out.write.bind(out);
    out.write = ((chunk: string) => {
      written++;
      return origWrite(chunk);
    }) as typeof out.write;
    const lines = boundedLines(out, 1000);
    lines.write('a\n');
    await turn();
    await turn();
    lines.write('b\n');
    await turn();
    expect(written).to.equal(1);
  });
});
