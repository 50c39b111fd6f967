// The hand-off's refusal (infrastructure/temporal/decision-handoff): once a decision's client is
// answered with an error here, an attempt this process's worker would still make does not run.
// (With a real worker and a run stopped between attempts: test/decisions.test.ts.)
import { expect } from 'chai';
import { DecisionHandoff } from '../../infrastructure/temporal/decision-handoff';
import type { DecisionResult } from '../../domain/decisions/service';

const result = (id: string): DecisionResult => ({
  id,
  model: 'm',
  provider: 'p',
  answers: {},
  usage: { input_tokens: 1, output_tokens: 1, cost: 0 },
});

/** An execute whose start fails, as one answered with an error. */
const failed = (h: DecisionHandoff, id: string) =>
  h
    .execute(id, () => Promise.reject(new Error('no server')))
    .then(
      () => expect.fail('answered'),
      () => undefined,
    );

describe('DecisionHandoff: no decision billed that its client does not get', () => {
  it('a server that fails to answer while an attempt decides here: the client gets that attempt’s decision, which it pays for', async () => {
    const h = new DecisionHandoff(10);
    let asked = 0;
    const deciding = h.decide('gen-s', () => new Promise((r) => setTimeout(() => r(result('gen-s')), 100)));
    const answer = await h.execute('gen-s', async () => ({
      eagerlyStarted: true,
      result: () => (asked++, Promise.reject(new Error('the server did not answer'))),
    }));
    expect(answer.id).to.equal('gen-s');
    expect(asked).to.equal(1);
    await deciding;
  });

  it('an attempt for a decision answered here with an error does not run; another decision’s does', async () => {
    const h = new DecisionHandoff();
    await failed(h, 'gen-a');
    let ran = 0;
    const attempt = (id: string) => async () => (ran++, result(id));
    const err = await h.decide('gen-a', attempt('gen-a')).then(
      () => null,
      (e: Error) => e,
    );
    expect(err?.message).to.match(/already answered with an error/);
    expect((err as { nonRetryable?: boolean }).nonRetryable).to.equal(true);
    expect(ran).to.equal(0);
    expect((await h.decide('gen-b', attempt('gen-b'))).id).to.equal('gen-b');
    expect(ran).to.equal(1);
  });

  it('forgets a refusal once its run could no longer try again, as later decisions come', async () => {
    const h = new DecisionHandoff(2_000, 50);
    await failed(h, 'gen-old');
    await new Promise((r) => setTimeout(r, 80));
    // Later refusals push the old one out (a constant cost per decision, no timer).
    await failed(h, 'gen-new-1');
    await failed(h, 'gen-new-2');
    expect((await h.decide('gen-old', async () => result('gen-old'))).id).to.equal('gen-old');
    await h
      .decide('gen-new-1', async () => result('x'))
      .then(
        () => expect.fail('ran'),
        () => undefined,
      );
  });
});
