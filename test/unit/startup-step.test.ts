// A start-up step that does not finish says so in the log, naming itself, until it does.
import { expect } from 'chai';
import { capturingLogger } from '../capture-log';
import { startupStep } from '../../cli/startup-step';

const capture = (level = 'debug') => capturingLogger(level);

const sleep = (ms: number) => new Promise((res) => setTimeout(res, ms));

describe('start-up steps', () => {
  it('warn, naming the step, while it is unfinished, and stop once it settles', async () => {
    const { lines, logger } = capture();
    let finish!: (v: string) => void;
    const step = startupStep(logger, 'connecting to Temporal at 127.0.0.1:7233', new Promise<string>((res) => (finish = res)), 40);
    for (let waited = 0; lines.length < 2 && waited < 2_000; waited += 10) await sleep(10);
    expect(lines.length).to.be.at.least(2);
    expect(lines[0]).to.include({
      level: 40,
      step: 'connecting to Temporal at 127.0.0.1:7233',
      msg: 'start-up still waiting: connecting to Temporal at 127.0.0.1:7233',
    });
    expect(lines[1].waited_ms).to.be.greaterThan(lines[0].waited_ms as number);
    finish('connected');
    expect(await step).to.equal('connected');
    const atFinish = lines.length;
    await sleep(150);
    expect(lines).to.have.length(atFinish);
  });

  it('pass a failure through, and stop warning', async () => {
    const { lines, logger } = capture();
    const failing = startupStep(
      logger,
      'connecting to MongoDB',
      sleep(10).then(() => Promise.reject(new Error('refused'))),
      40,
    );
    const err = await failing.then(
      () => null,
      (e: Error) => e,
    );
    expect(err?.message).to.equal('refused');
    await sleep(100);
    expect(lines).to.have.length(0);
  });
});
