// Decision maths, prompt rendering and the catalog's decision models: pure, no services.
import { expect } from 'chai';
import { answerFromDistribution, answerFromNative, choiceConfidence, normalize, scoreConfidence } from '../../domain/decisions/answers';
import { labelsOf, logprobRequest, readLabelDistribution, renderPrompt } from '../../domain/decisions/prompt';
import type { Question } from '../../domain/decisions/types';
import { servedBy } from '../../domain/decisions/evaluate';
import { Catalog } from '../../domain/catalog';
import { DEFAULT_CATALOG_PATH } from '../../infrastructure/config';
import { questions, state } from '../decision-sample';

describe('decision maths', () => {
  it('score and confidence match the published worked example', () => {
    const q = { type: 'score', instructions: 'x', criteria: ['a', 'b', 'c', 'd', 'e'] } as Question;
    const a = answerFromDistribution(q, [0.005, 0.005, 0.04, 0.25, 0.7]) as any;
    expect(a.score).to.be.closeTo(3.635, 1e-12);
    expect(a.confidence).to.be.closeTo(0.6958, 1e-4);
    expect(a.legend).to.deep.equal({ 0: 'a', 1: 'b', 2: 'c', 3: 'd', 4: 'e' });
    expect(Object.keys(a.probabilities)).to.deep.equal(['0', '1', '2', '3', '4']);
  });

  it('choice takes the argmax (first on ties) with (n·p_max − 1)/(n − 1) confidence', () => {
    expect(choiceConfidence([0.88, 0.12])).to.be.closeTo(0.76, 1e-12);
    expect(choiceConfidence([1 / 3, 1 / 3, 1 / 3])).to.be.closeTo(0, 1e-12);
    expect(choiceConfidence([1])).to.equal(1);
    const q = { type: 'choice', instructions: 'x', criteria: { a: null, b: null, c: null } } as Question;
    expect((answerFromDistribution(q, [0.4, 0.4, 0.2]) as any).choice).to.equal('a');
  });

  it('noul is P(true) with no confidence; distributions are renormalized', () => {
    const q = { type: 'noul', instructions: 'x' } as Question;
    expect(answerFromDistribution(q, [1, 3])).to.deep.equal({ type: 'noul', noul: 0.75 });
    expect(normalize([0, 0])).to.deep.equal([0.5, 0.5]);
    expect(scoreConfidence([1])).to.equal(1);
    expect(scoreConfidence([0.5, 0, 0.5])).to.equal(0); // bimodal: d = 1 > U = 2/3, clamped
    expect(scoreConfidence([0.2, 0.6, 0.2])).to.be.closeTo(1 - 0.4 / (2 / 3), 1e-12);
  });

  it('renders prompts deterministically with single-token labels', () => {
    const choice = questions.topic as unknown as Question;
    expect(labelsOf(choice)).to.deep.equal(['A', 'B', 'C']);
    expect(labelsOf(questions.severity as unknown as Question)).to.deep.equal(['0', '1', '2', '3']);
    expect(labelsOf(questions.urgent as unknown as Question)).to.deep.equal(['no', 'yes']);
    const { messages } = renderPrompt(state, choice);
    expect(messages[1].content).to.equal(
      [
        '<state>',
        JSON.stringify(state, null, 2),
        '</state>',
        '',
        'Question: Which team?',
        '',
        'Options:',
        'A: billing',
        'B: bug — A defect in the product',
        'C: account — {"about":"logins"}',
        '',
        'Answer with exactly one of: A, B, C',
      ].join('\n'),
    );
    expect(renderPrompt(state, choice)).to.deep.equal(renderPrompt(JSON.parse(JSON.stringify(state)), choice));
    expect(logprobRequest(state, choice).body).to.include({ max_tokens: 1, temperature: 0, logprobs: true, top_logprobs: 20 });
  });

  it('reads label log-probabilities: variants merge, missing labels sit below the least likely, -9999 is not a value', () => {
    const completion = (top: [string, number][]) => ({
      choices: [{ logprobs: { content: [{ top_logprobs: top.map(([token, logprob]) => ({ token, logprob })) }] } }],
    });
    const r = readLabelDistribution(
      completion([
        ['A', Math.log(0.5)],
        [' a', Math.log(0.1)],
        ['B', Math.log(0.2)],
        ['The', Math.log(0.1)],
        ['C', -9999],
      ]),
      ['A', 'B', 'C'],
      'p',
    );
    const [a, b, c] = [0.6, 0.2, Math.exp(Math.log(0.2) - 1)];
    expect(r.probabilities[0]).to.be.closeTo(a / (a + b + c), 1e-12);
    expect(r.probabilities[2]).to.be.closeTo(c / (a + b + c), 1e-12);
    expect(r.labelMass).to.be.closeTo(0.8, 1e-12);
    expect(() => readLabelDistribution(completion([['The', -0.1]]), ['A', 'B'], 'p')).to.throw(
      'returned no log-probabilities for the answer labels',
    );
  });

  it('checks and normalizes native answers', () => {
    const choice = questions.topic as unknown as Question;
    const renorm = answerFromNative(
      choice,
      { type: 'choice', choice: 'bug', probabilities: { billing: 0.2, bug: 0.6, account: 0.2 } },
      'topic',
      's',
    ) as any;
    expect(renorm.probabilities).to.deep.equal({ billing: 0.2, bug: 0.6, account: 0.2 });
    expect(renorm.confidence).to.be.closeTo(0.4, 1e-12);
    const scaled = answerFromNative(
      choice,
      { type: 'choice', choice: 'bug', probabilities: { billing: 0.1, bug: 0.3, account: 0.1 } },
      'topic',
      's',
    ) as any;
    expect(scaled.probabilities.bug).to.be.closeTo(0.6, 1e-12);
    expect(() => answerFromNative(choice, { type: 'noul', noul: 1 }, 'topic', 's')).to.throw('invalid answer for question "topic"');
    expect(() => answerFromNative(choice, { type: 'choice', choice: 'other' }, 'topic', 's')).to.throw('not one of the labels');
    expect(() => answerFromNative(questions.urgent as unknown as Question, { type: 'noul', noul: 1.5 }, 'urgent', 's')).to.throw(
      'from 0 to 1',
    );
    expect(() => answerFromNative(choice, undefined, 'topic', 's')).to.throw('missing');
  });
});

describe('decision models in the default catalog', () => {
  it('each has at least two providers, so a decision can fall back', () => {
    const catalog = Catalog.fromFile(DEFAULT_CATALOG_PATH, { SANDBOX_URL: 'http://x' });
    const decisionModels = catalog.models.filter((m) => m.kind === 'decision');
    expect(decisionModels.length).to.be.greaterThan(0);
    for (const m of decisionModels) expect(new Set(m.endpoints.map((e) => e.provider.slug)).size, m.id).to.be.at.least(2);
  });

  it('a decision names the provider that answered most questions, each question its own only when they differ', () => {
    expect(
      servedBy([
        ['a', 'p'],
        ['b', 'p'],
      ]),
    ).to.deep.equal({ provider: 'p' });
    expect(
      servedBy([
        ['a', 'p'],
        ['b', 'q'],
        ['c', 'q'],
      ]),
    ).to.deep.equal({ provider: 'q', providers: { a: 'p', b: 'q', c: 'q' } });
    expect(
      servedBy([
        ['a', 'p'],
        ['b', 'q'],
      ]).provider,
    ).to.equal('p'); // a tie: the first question's
  });
});
