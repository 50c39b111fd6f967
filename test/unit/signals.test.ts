// A shutdown ends: every stop runs in turn, and one that never finishes is cut off at the deadline.
import { spawn } from 'node:child_process';
import path from 'node:path';
import { expect } from 'chai';

/**
 * A process that stops with `stopOnSignals`, its one stop taking `stopMs` (or never ending); once
 * ready, sent SIGTERM, or stopped from within (`halt`: the function `stopOnSignals` returns, called
 * with 1), or both, the halt 50 ms into the signal's shutdown.
 */
async function shutdown(
  stopMs: number | null,
  deadlineMs: number,
  how: 'signal' | 'halt' | 'signal, then halt' = 'signal',
): Promise<{ code: number | null; ms: number; output: string }> {
  const signals = path.join(__dirname, '..', '..', 'cli', 'signals.js');
  const log = path.join(__dirname, '..', '..', 'infrastructure', 'log', 'index.js');
  const script = `
    const { stopOnSignals } = require(${JSON.stringify(signals)});
    const { createLogger } = require(${JSON.stringify(log)});
    const stop = () => ${stopMs === null ? 'new Promise(() => {})' : `new Promise((r) => setTimeout(r, ${stopMs}))`};
    let stops = 0;
    const counted = async () => { stops++; await stop(); process.stdout.write('stopped ' + stops + '\\n'); };
    const halt = stopOnSignals(createLogger('info', 'test', { format: 'json' }), [counted], { deadlineMs: ${deadlineMs} });
    process.on('SIGUSR2', () => halt(1));
    setInterval(() => {}, 1000);
    process.stdout.write('ready\\n');`;
  const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout.on('data', (b: Buffer) => (output += b.toString()));
  child.stderr.on('data', (b: Buffer) => (output += b.toString()));
  while (!output.includes('ready')) await new Promise((r) => setTimeout(r, 20));
  const started = Date.now();
  if (how === 'halt') child.kill('SIGUSR2');
  else child.kill('SIGTERM');
  if (how === 'signal, then halt') setTimeout(() => child.kill('SIGUSR2'), 50);
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

  it('stopped from within (a part that keeps crashing), runs the same stops once and exits 1', async () => {
    const r = await shutdown(200, 5_000, 'halt');
    expect(r.code, r.output).to.equal(1);
    expect(r.output).to.include('stopped 1').and.not.include('stopped 2');
  });

  it('stopped from within during a shutdown on a signal, does not stop twice, and exits 1', async () => {
    const r = await shutdown(200, 5_000, 'signal, then halt');
    expect(r.code, r.output).to.equal(1);
    expect(r.output).to.include('stopped 1').and.not.include('stopped 2');
  });
});
