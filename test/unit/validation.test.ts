// Validation cost is bounded by the schema, not by the input: a body (or a batch line) with 10⁵
// invalid items is refused after its first, with a bounded report. Collecting every error made
// this quadratic: 50,000 bad messages took 50 s and froze the process.
import { expect } from 'chai';
import { compileBody } from '../../infrastructure/validation/index';
import { ChatCompletionRequest } from '../../domain/completions/schema';
import { lineProblem } from '../../domain/batches/lines';

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
});
