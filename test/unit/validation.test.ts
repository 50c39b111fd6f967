// Validation cost is bounded by the schema, not by the input: a body (or a batch line) with 10⁵
// invalid items is refused after its first, with a bounded report. Collecting every error made
// this quadratic: 50,000 bad messages took 50 s and froze the process.
import { expect } from 'chai';
import { Type } from '@sinclair/typebox';
import { compileBody, compileQuery } from '../../infrastructure/validation/index';
import { ChatCompletionRequest } from '../../domain/completions/schema';
import { checkLine, lineProblem, type LineCheck } from '../../domain/batches/lines';

const many = (item: unknown) => Array.from({ length: 100_000 }, () => item);

describe('validation of large invalid bodies', () => {
  const chat = compileBody(ChatCompletionRequest);

  it('refuses 10⁵ bad messages naming the first, with at most 20 errors reported', () => {
    for (const item of [5, { role: 'user', content: 5 }, { content: 'x' }]) {
      const started = performance.now();
      let err: any;
      try {
        chat({ model: 'm', messages: many(item) });
      } catch (e) {
        err = e;
      }
      expect(performance.now() - started, JSON.stringify(item)).to.be.below(100);
      expect(err?.status).to.equal(400);
      expect(err.message).to.match(/^messages\[0\]/);
      expect(err.metadata.errors.length).to.be.within(1, 20);
    }
  });

  it('still reports every problem of a small body, the most specific first', () => {
    let err: any;
    try {
      chat({ model: 5, messages: [{ role: 'user', content: 5 }], temperature: 9 });
    } catch (e) {
      err = e;
    }
    const fields = err.metadata.errors.map((e: { field: string }) => e.field);
    expect(fields).to.include.members(['model', 'messages[0].content', 'temperature']);
  });

  it('a batch line with 10⁵ bad messages is a problem named at once (the worker checks every line)', () => {
    const started = performance.now();
    expect(lineProblem('/v1/chat/completions', { messages: many(5) })).to.match(/^messages\[0\]/);
    expect(performance.now() - started).to.be.below(100);
  });

  it('50,000 bad batch lines are all counted at create and ten described, without holding the process', () => {
    const bodies = [{ messages: [] }, { messages: [{ role: 'user', content: 'x' }], max_tokens: -1 }, { messages: 'x' }];
    const found: LineCheck = { invalid: 0, examples: [] };
    const started = performance.now();
    for (let i = 0; i < 50_000; i++) checkLine('/v1/chat/completions', `c${i}`, bodies[i % 3], found);
    // Described in full, every line took 430-585 ms here; counted, 28-42 ms.
    expect(performance.now() - started).to.be.below(250);
    expect(found.invalid).to.equal(50_000);
    expect(found.examples).to.have.length(10);
    expect(found.examples.slice(0, 3)).to.deep.equal([
      'c0 (messages: must NOT have fewer than 1 items)',
      'c1 (max_tokens: must be >= 1)',
      'c2 (messages: must be array)',
    ]);
    const good: LineCheck = { invalid: 0, examples: [] };
    checkLine('/v1/chat/completions', 'ok', { messages: [{ role: 'user', content: 'x' }], max_tokens: 1 }, good);
    expect(good).to.deep.equal({ invalid: 0, examples: [] });
  });

  it("a validator's valid() agrees with it, a query's finite-number check included", () => {
    const chat = compileBody(ChatCompletionRequest);
    expect(chat.valid({ model: 'm', messages: [{ role: 'user', content: 'x' }] })).to.equal(true);
    expect(chat.valid({ model: 'm', messages: 5 })).to.equal(false);
    const query = compileQuery(Type.Object({ n: Type.Optional(Type.Number()) }));
    expect(query.valid({ n: '3' })).to.equal(true);
    expect(query.valid({ n: '1e309' })).to.equal(false);
  });
});
