// The sandbox provider's own contract: wire formats, label log-probabilities, injected faults.
import { expect } from 'chai';
import { stack } from './fixture';

async function post(path: string, body: unknown, headers: Record<string, string> = {}) {
  const res = await fetch(`${stack.sandboxUrl}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  return { status: res.status, headers: res.headers, body: (await res.json()) as any };
}

describe('sandbox provider', () => {
  it('answers a constrained question with one label and log-probabilities over the labels', async () => {
    const r = await post('/openai/v1/chat/completions', {
      model: 'm',
      max_tokens: 1,
      logprobs: true,
      top_logprobs: 5,
      messages: [{ role: 'user', content: 'Is the sky green?\nAnswer with exactly one of: A, B' }],
    });
    expect(r.status).to.equal(200);
    const choice = r.body.choices[0];
    expect(['A', 'B']).to.include(choice.message.content);
    const top = choice.logprobs.content[0].top_logprobs as { token: string; logprob: number }[];
    expect(top.map((t) => t.token)).to.include.members(['A', 'B']);
    const labelMass = top.filter((t) => ['A', 'B'].includes(t.token)).reduce((s, t) => s + Math.exp(t.logprob), 0);
    expect(labelMass).to.be.closeTo(0.97, 1e-9);
    expect(top[0].token).to.equal(choice.message.content);
    expect(r.body.usage.completion_tokens).to.equal(1);
  });

  it('answers System One questions with full distributions', async () => {
    const r = await post('/systemone/v1/systemone', {
      model: 'jev-1.13',
      state: { ticket: 'refund please' },
      questions: {
        a: { type: 'choice', instructions: 'topic', criteria: { billing: null, bug: 'a defect' } },
        b: { type: 'score', instructions: 'urgency', criteria: ['low', 'mid', 'high'] },
      },
    });
    const { a, b } = r.body.answers;
    expect(Object.values<number>(a.probabilities).reduce((x, y) => x + y)).to.be.closeTo(1, 1e-12);
    expect(a.choice).to.equal(Object.entries<number>(a.probabilities).sort((x, y) => y[1] - x[1])[0][0]);
    expect(Object.keys(b.probabilities)).to.deep.equal(['0', '1', '2']);
    expect(b.legend).to.deep.equal({ 0: 'low', 1: 'mid', 2: 'high' });
    expect(r.body.usage.input_tokens).to.be.greaterThan(0);
  });

  it("injects latency, statuses and overloads from headers, in each API's error shape", async () => {
    const started = Date.now();
    expect((await post('/openai/v1/embeddings', { model: 'e', input: 'x' }, { 'x-sandbox-latency': '200' })).status).to.equal(200);
    expect(Date.now() - started).to.be.at.least(195);
    const openai = await post(
      '/openai/v1/chat/completions',
      { model: 'm', messages: [] },
      { 'x-sandbox-status': '503', 'x-sandbox-retry-after': '2' },
    );
    expect(openai.status).to.equal(503);
    expect(openai.headers.get('retry-after')).to.equal('2');
    expect(openai.body.error).to.include({ type: 'api_error', code: 503 });
    const anthropic = await post('/anthropic/v1/messages', { model: 'm', max_tokens: 1, messages: [] }, { 'x-sandbox-overloaded': '1' });
    expect(anthropic.status).to.equal(529);
    expect(anthropic.body).to.deep.equal({ type: 'error', error: { type: 'overloaded_error', message: 'sandbox: injected overload' } });
  });

  it('answers a background response queued, with no output or usage, as OpenAI does (what the gateway refuses background for)', async () => {
    const r = await post('/openai/v1/responses', { model: 'm', input: 'write a novel', background: true });
    expect(r.status).to.equal(200);
    expect(r.body).to.deep.include({ object: 'response', status: 'queued', output: [], usage: null });
    const now = await post('/openai/v1/responses', { model: 'm', input: 'write a novel' });
    expect(now.body.status).to.equal('completed');
    expect(now.body.usage.output_tokens).to.be.above(0);
  });

  it('fails only the first calls with fail_first, counted per fault spec', async () => {
    const path = `/~case=${Date.now()},status=500,fail_first=2/openai/v1/responses`;
    const statuses = [];
    for (let i = 0; i < 3; i++) statuses.push((await post(path, { model: 'm', input: 'hi' })).status);
    expect(statuses).to.deep.equal([500, 500, 200]);
  });

  it('rejects requests its real counterpart would reject', async () => {
    expect((await post('/anthropic/v1/messages', { model: 'm', messages: [{ role: 'user', content: 'x' }] })).status).to.equal(400); // no max_tokens
    const res = await fetch(`${stack.sandboxUrl}/openai/v1/chat/completions`, { method: 'POST', body: '{nope' });
    expect(res.status).to.equal(400);
  });
});
