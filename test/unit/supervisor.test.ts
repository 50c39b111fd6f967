// The supervisor restarts an embedded process that exits; stopped while a restart is under way
// (its backoff or its start), it leaves nothing running. Real child processes.
import { expect } from 'chai';
import { startProcess, type ManagedProcess } from '../../devstack/processes';
import { Supervisor } from '../../devstack/supervisor';
import { createLogger } from '../../infrastructure/log';
import { until } from '../until';

const logger = createLogger('silent', 'test', { format: 'json' });

/** A start function whose processes idle until stopped; `delayMs` holds back every start after the first. */
function idler(delayMs = 0) {
  const started: ManagedProcess[] = [];
  let starting = 0;
  const start = async () => {
    starting++;
    const p = startProcess('idler', process.execPath, ['-e', 'setInterval(() => {}, 1000)']);
    if (started.length > 0) await new Promise((r) => setTimeout(r, delayMs));
    started.push(p);
    return p;
  };
  return { start, started, starting: () => starting };
}

describe('supervisor', () => {
  it('restarts a part that exits, and stops the new one when stopped', async () => {
    const part = idler();
    const supervisor = new Supervisor(logger, () => expect.fail('gave up'));
    await supervisor.keep('idler', part.start);
    await part.started[0].kill();
    expect(supervisor.status().idler).to.equal('restarting');
    await until('the restart', () => part.started.length === 2 && supervisor.status().idler === 'ok', 5_000, 20);
    expect(part.started[1].hasExited).to.equal(false);
    await supervisor.stop();
    expect(part.started[1].hasExited).to.equal(true);
  });

  it('stopped during the backoff before a restart, starts nothing more', async () => {
    const part = idler();
    const supervisor = new Supervisor(logger, () => expect.fail('gave up'));
    await supervisor.keep('idler', part.start);
    await part.started[0].kill();
    await supervisor.stop();
    await new Promise((r) => setTimeout(r, 800)); // past the first backoff (500 ms)
    expect(part.starting()).to.equal(1);
  });

  it('stopped while a restart is starting the part, returns only once that process is stopped too', async () => {
    const part = idler(400);
    const supervisor = new Supervisor(logger, () => expect.fail('gave up'));
    await supervisor.keep('idler', part.start);
    await part.started[0].kill();
    await until('the restart to begin', () => part.starting() === 2, 5_000, 20);
    await supervisor.stop();
    expect(part.started).to.have.length(2);
    expect(part.started[1].hasExited, 'the process started during the stop').to.equal(true);
  });

  it('stopped while a restarted part fails to start, returns without waiting out another backoff', async () => {
    let starts = 0;
    const first = startProcess('idler', process.execPath, ['-e', 'setInterval(() => {}, 1000)']);
    const start = async () => {
      if (starts++ === 0) return first;
      await new Promise((r) => setTimeout(r, 300));
      throw new Error('cannot start');
    };
    const supervisor = new Supervisor(logger, () => expect.fail('gave up'));
    await supervisor.keep('idler', start);
    await first.kill();
    await until('the restart to begin', () => starts === 2, 5_000, 20);
    const stopping = Date.now();
    await supervisor.stop();
    // The failed start ends the restart; the next backoff would be 1 s.
    expect(Date.now() - stopping).to.be.below(800);
    expect(starts).to.equal(2);
  });
});
