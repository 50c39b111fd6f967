// A shutdown ends: every stop runs in turn, and one that never finishes is cut off at the deadline.
import { spawn } from 'node:child_process';
import path from 'node:path';
import { expect } from 'chai';

/** A process that stops with `stopOnSignals`, its one stop taking `stopMs` (or never ending); killed with SIGTERM once ready. */
async function shutdown(stopMs: number | null, deadlineMs: number): Promise<{ code: number | null; ms: number; output: string }> {
  const signals = path.join(__dirname, '..', '..', 'cli', 'signals.js');
  const log = path.join(__dirname, '..', '..', 'infrastructure', 'log', 'index.js');
  const script = `
    const { stopOnSignals } = require(${JSON.stringify(signals)});
    const { createLogger } = require(${JSON.stringify(log)});
    const stop = () => ${stopMs === null ? 'new Promise(() => {})' : `new Promise((r) => setTimeout(r, ${stopMs}))`};
    stopOnSignals(createLogger('info', 'test', { format: 'json' }), [stop], { deadlineMs: ${deadlineMs} });
    setInterval(() => {}, 1000);
    process.stdout.write('ready\\n');`;
  const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout.on('data', (b: Buffer) => (output += b.toString()));
  child.stderr.on('data', (b: Buffer) => (output += b.toString()));
  while (!output.includes('ready')) await new Promise((r) => setTimeout(r, 20));
  const started = Date.now();
  child.kill('SIGTERM');
  const code = await new Promise<number | null>((r) => child.once('exit', r));
  return { code, ms: Date.now() - started, output };
}

describe('shutdown on a signal', () => {
  it('runs the stops and exits 0 once they are done', async () => {
    const r = await shutdown(200, 5_000);
    expect(r.code, r.output).to.equal(0);
    expect(r.ms).to.be.within(150, 3_000);
  });

  it('exits 1 at the deadline when a stop never finishes, saying so', async () => {
    const r = await shutdown(null, 500);
    expect(r.code, r.output).to.equal(1);
    expect(r.ms).to.be.within(400, 3_000);
    expect(r.output).to.include('shutdown did not finish in time; exiting');
  });
});
