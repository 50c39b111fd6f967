// Validation cost is bounded by the schema, not by the input: a body (or a batch line) with 10⁵
// invalid items is refused after its first, with a bounded report. Collecting every error made
// this quadratic: 50,000 bad messages took 50 s and froze the process.
import { expect } from 'chai';
import { Type } from '@sinclair/typebox';
import { compileBody, compileQuery } from '../../infrastructure/validation/index';
import { ChatCompletionRequest } from '../../domain/completions/schema';
import { checkLine, lineProblem, type LineCheck } from '../../domain/batches/lines';
import { jsonLengthAtMost } from '../../infrastructure/validation/json-length';
import { TRACE_MAX_JSON_LENGTH } from '../../infrastructure/validation/types';

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

describe('a bound on a value as JSON text (x-maxJsonLength)', () => {
  it('measures exactly what JSON.stringify writes, escapes, nesting and empty containers included', () => {
    const values: unknown[] = [
      'plain',
      'quote " and \\ and \n and \u0001',
      { a: [1, 2.5, -3e-7, true, null, { b: {} }, []], 'k"ey': 'é漢字' },
      [[[]], {}, ''],
      42,
      null,
    ];
    for (const v of values) {
      const n = JSON.stringify(v).length;
      expect(jsonLengthAtMost(v, n), JSON.stringify(v)).to.equal(true);
      expect(jsonLengthAtMost(v, n - 1), JSON.stringify(v)).to.equal(false);
    }
  });

  it('stops as soon as it has counted past the bound, without reading the rest of the value', () => {
    let reads = 0;
    const unread = {};
    for (let i = 0; i < 1_000; i++) Object.defineProperty(unread, `k${i}`, { enumerable: true, get: () => ++reads });
    expect(jsonLengthAtMost({ a: unread, b: 'x'.repeat(100) }, 50)).to.equal(false);
    expect(reads).to.equal(0);
    expect(jsonLengthAtMost({ a: unread }, 100_000)).to.equal(true); // the same value within its bound is read whole
    expect(reads).to.be.at.least(1_000);
  });

  it('refuses a request whose trace is one character over the bound, naming the field, and takes one at it', () => {
    const chat = compileBody(ChatCompletionRequest);
    const base = { model: 'm', messages: [{ role: 'user', content: 'x' }] };
    const pad = TRACE_MAX_JSON_LENGTH - JSON.stringify({ trace_id: 't', x: '' }).length;
    const atLimit = { trace_id: 't', x: 'v'.repeat(pad) };
    expect(JSON.stringify(atLimit).length).to.equal(TRACE_MAX_JSON_LENGTH);
    expect(chat.valid({ ...base, trace: atLimit })).to.equal(true);
    let err: any;
    try {
      chat({ ...base, trace: { ...atLimit, x: `${atLimit.x}v` } });
    } catch (e) {
      err = e;
    }
    expect(err?.status).to.equal(400);
    expect(err.message).to.equal(`trace: must NOT be longer than ${TRACE_MAX_JSON_LENGTH} characters as JSON`);
  });
});
