// POST /api/v1/systemone end to end: validation, answers against the formulas, native and logprob
// endpoints, upstream failures, usage and debit, session precedence, and the OpenRouter SDK.
import { expect } from 'chai';
import { Client, Connection, WorkflowClient } from '@temporalio/client';
import { logprobRequest } from '../domain/decisions/prompt';
import type { Question } from '../domain/decisions/types';
import { fromJsonText } from '../infrastructure/store/json-text';
import { usageDetails } from '../domain/accounts/usage-ledger';
import { decisionWorkflow } from '../workflows/decision';
import { questions, state } from './decision-sample';
import { DecisionHandoff } from '../infrastructure/temporal/decision-handoff';
import type { DecisionResult } from '../domain/decisions/service';
import { stack } from './fixture';
import {
  call,
  createTenant,
  expectJsonAnswerHeaders,
  startTestGateway,
  writeTestCatalog,
  type Tenant,
  type TestGateway,
  storedRecord,
  storedUsage,
} from './helpers';

function testCatalogFile(): string {
  return writeTestCatalog('decisions', (base) => {
    const faulty = (slug: string, faults: string, extra = {}) => ({
      slug,
      name: slug,
      adapter: 'systemone',
      base_url: `\${SANDBOX_URL}/~dec=1,${faults}/systemone`,
      collects_data: false,
      zdr: true,
      max_concurrency: 10,
      timeout_ms: 5000,
      ...extra,
    });
    base.providers.push(
      // Slower than DECISION_TIMEOUT_MS below; s1-timeout's own timeout far below it, so that under
      // load its 524 is still the provider's (with its metadata), not the decision's.
      faulty('s1-slow', 'latency=4000,tag=slow', { timeout_ms: 10_000 }),
      faulty('s1-500', 'status=500'),
      faulty('s1-timeout', 'timeout', { timeout_ms: 200 }),
      faulty('s1-busy', 'overloaded'),
      faulty('s1-429', 'status=429,retry_after=20'),
      // Chat endpoints whose first call fails: one question falls back, the others stay (one per mode).
      ...['inline', 'workflow'].map((mode) => ({
        ...faulty(`chat-first-fails-${mode}`, `status=500,fail_first=1,tag=${mode}`),
        adapter: 'openai',
        base_url: `\${SANDBOX_URL}/~dec=1,status=500,fail_first=1,tag=${mode}/openai/v1`,
      })),
    );
    const model = (id: string, providers: string[]) => ({
      id,
      name: id,
      kind: 'decision',
      family: id,
      version: '1',
      released: '20260101',
      context_length: 1000,
      distillable: false,
      endpoints: providers.map((p, i) => ({
        provider: p,
        upstream_model: 'jev-1.13',
        pricing: { prompt: 0.1 * (i + 1), completion: 0.1 },
        quantization: 'bf16',
        supported_parameters: [],
      })),
    });
    base.models.push(
      model('test/dec-500', ['s1-500']),
      model('test/dec-timeout', ['s1-timeout']),
      model('test/dec-busy', ['s1-busy']),
      model('test/dec-429', ['s1-429']),
      model('test/dec-fallback', ['s1-500', 'sandbox-systemone']),
      model('test/dec-slow', ['s1-slow']),
      ...['inline', 'workflow'].map((mode) => {
        const chat = model(`split/dec-${mode}`, [`chat-first-fails-${mode}`, 'sandbox-alpha']);
        for (const e of chat.endpoints)
          Object.assign(e, { upstream_model: 'sandbox-chat-small', supported_parameters: ['logprobs', 'top_logprobs'] });
        return chat;
      }),
    );
  });
}

// The whole suite runs once per execution mode: both must answer, fail and bill alike.
for (const mode of ['inline', 'workflow'] as const)
  describe(`POST /api/v1/systemone (DECISIONS_EXECUTION=${mode})`, () => {
    let gw: TestGateway;
    let t: Tenant;
    const decide = (body: unknown, opts: { key?: string; headers?: Record<string, string> } = {}) =>
      call(`${gw.url}/api/v1/systemone`, { key: opts.key ?? t.inferenceKey, body, headers: opts.headers });

    before(async function () {
      this.timeout(60_000);
      gw = await startTestGateway({
        env: {
          DECISIONS_EXECUTION: mode,
          DECISION_TIMEOUT_MS: '2000',
          CATALOG_PATH: testCatalogFile(),
          DECISION_MAX_QUESTIONS: '5',
          DECISION_MAX_CHOICES: '4',
          DECISION_MAX_SCORE_LEVELS: '4',
          DECISION_MAX_STATE_BYTES: '2kb',
        },
      });
      t = await createTenant(gw.store, 5);
    });
    after(async () => {
      await gw.stop();
    });

    describe('validation', () => {
      const base = { model: 'jev-1.13', state: 'hello', questions: { q1: { type: 'noul', instructions: 'ok?' } } };
      const cases: [string, unknown, string][] = [
        ['model missing', { state: 'x', questions: base.questions }, 'model: is required'],
        ['state missing', { model: 'jev-1.13', questions: base.questions }, 'state: is required'],
        ['questions missing', { model: 'jev-1.13', state: 'x' }, 'questions: is required'],
        ['model empty', { ...base, model: '' }, 'model: must NOT have fewer than 1 characters'],
        ['state a number', { ...base, state: 42 }, 'state: must be string, object or array'],
        ['state null', { ...base, state: null }, 'state: must be string, object or array'],
        ['no questions', { ...base, questions: {} }, 'questions: must NOT have fewer than 1 properties'],
        [
          'too many questions',
          { ...base, questions: Object.fromEntries([1, 2, 3, 4, 5, 6].map((i) => [`q${i}`, base.questions.q1])) },
          'questions: must NOT have more than 5 properties',
        ],
        ['a question that is not an object', { ...base, questions: { q1: 'yes?' } }, 'questions.q1: must be object'],
        [
          'a question name over 256 characters',
          { ...base, questions: { ['q'.repeat(257)]: base.questions.q1 } },
          `questions: key "${'q'.repeat(40)}"…: must NOT have more than 256 characters`,
        ],
        [
          'an empty question name',
          { ...base, questions: { '': base.questions.q1 } },
          'questions: key "": must NOT have fewer than 1 characters',
        ],
        [
          'an empty choice label',
          { ...base, questions: { q1: { type: 'choice', instructions: 'x', criteria: { '': null, b: null } } } },
          'questions.q1.criteria: key "": must NOT have fewer than 1 characters',
        ],
        [
          'an unknown question type',
          { ...base, questions: { q1: { type: 'maybe', instructions: 'x' } } },
          'questions.q1.type: must be one of "noul", "choice", "score"',
        ],
        ['a question without type', { ...base, questions: { q1: { instructions: 'x' } } }, 'questions.q1.type: is required'],
        ['instructions missing', { ...base, questions: { q1: { type: 'noul' } } }, 'questions.q1.instructions: is required'],
        [
          'instructions a number',
          { ...base, questions: { q1: { type: 'noul', instructions: 3 } } },
          'questions.q1.instructions: must be string, object or array',
        ],
        [
          'noul criteria with an extra key',
          { ...base, questions: { q1: { type: 'noul', instructions: 'x', criteria: { true: 'a', false: 'b', maybe: 'c' } } } },
          'questions.q1.criteria.maybe: is not an allowed field',
        ],
        [
          'noul criteria without false',
          { ...base, questions: { q1: { type: 'noul', instructions: 'x', criteria: { true: 'a' } } } },
          'questions.q1.criteria.false: is required',
        ],
        [
          'noul with an unknown field',
          { ...base, questions: { q1: { type: 'noul', instructions: 'x', options: [] } } },
          'questions.q1.options: is not an allowed field',
        ],
        [
          'choice without criteria',
          { ...base, questions: { q1: { type: 'choice', instructions: 'x' } } },
          'questions.q1.criteria: is required',
        ],
        [
          'choice with no options',
          { ...base, questions: { q1: { type: 'choice', instructions: 'x', criteria: {} } } },
          'questions.q1.criteria: must NOT have fewer than 1 properties',
        ],
        [
          'choice over the option limit',
          { ...base, questions: { q1: { type: 'choice', instructions: 'x', criteria: { a: null, b: null, c: null, d: null, e: null } } } },
          'questions.q1.criteria: must NOT have more than 4 properties',
        ],
        [
          'choice guidance a number',
          { ...base, questions: { q1: { type: 'choice', instructions: 'x', criteria: { a: 1 } } } },
          'questions.q1.criteria.a: must be string, object, array or null',
        ],
        [
          'choice criteria an array',
          { ...base, questions: { q1: { type: 'choice', instructions: 'x', criteria: ['a'] } } },
          'questions.q1.criteria: must be object',
        ],
        [
          'score without levels',
          { ...base, questions: { q1: { type: 'score', instructions: 'x', criteria: [] } } },
          'questions.q1.criteria: must NOT have fewer than 1 items',
        ],
        [
          'score over the level limit',
          { ...base, questions: { q1: { type: 'score', instructions: 'x', criteria: ['a', 'b', 'c', 'd', 'e'] } } },
          'questions.q1.criteria: must NOT have more than 4 items',
        ],
        [
          'score criteria an object',
          { ...base, questions: { q1: { type: 'score', instructions: 'x', criteria: { a: 1 } } } },
          'questions.q1.criteria: must be array',
        ],
        [
          'score level a boolean',
          { ...base, questions: { q1: { type: 'score', instructions: 'x', criteria: ['a', true] } } },
          'questions.q1.criteria[1]: must be string, object or array',
        ],
        ['an unknown provider preference', { ...base, provider: { fastest: true } }, 'provider.fastest: is not an allowed field'],
        [
          'a bad sort',
          { ...base, provider: { sort: 'cheapest' } },
          'provider.sort: must be one of "price", "throughput", "latency", "exacto"',
        ],
        ['session_id over 256', { ...base, session_id: 's'.repeat(257) }, 'session_id: must NOT have more than 256 characters'],
        ['user over 256', { ...base, user: 'u'.repeat(257) }, 'user: must NOT have more than 256 characters'],
        ['trace not an object', { ...base, trace: 'abc' }, 'trace: must be object'],
        ['trace_id not a string', { ...base, trace: { trace_id: 5 } }, 'trace.trace_id: must be string'],
        ['an unknown top-level field', { ...base, questons: {} }, 'questons: is not an allowed field'],
      ];
      for (const [name, body, message] of cases) {
        it(`400 for ${name}`, async () => {
          const r = await decide(body);
          expect(r.status, JSON.stringify(r.body)).to.equal(400);
          expect(r.body.error.message).to.equal(message);
          expect(r.body.error.code).to.equal(400);
        });
      }

      it('accepts every guidance shape, extra trace keys, a 256-character session id, question name and choice label', async () => {
        const r = await decide({
          ...base,
          state: [{ line: 1 }, 'two'],
          session_id: 's'.repeat(256),
          user: 'u'.repeat(256),
          trace: { trace_id: 't', custom_tag: { a: 1 } },
          questions: {
            q1: { type: 'noul', instructions: ['a', 'b'] },
            q2: { type: 'choice', instructions: { q: 'x' }, criteria: { only: null } },
            q3: { type: 'score', instructions: 'x', criteria: [{ level: 'one' }] },
            ['n'.repeat(256)]: { type: 'choice', instructions: 'x', criteria: { ['c'.repeat(256)]: 'long', short: null } },
          },
        });
        expect(r.status, JSON.stringify(r.body)).to.equal(200);
        expect(r.body.answers['n'.repeat(256)].probabilities).to.have.keys('c'.repeat(256), 'short');
        // One option and one level answer with full confidence.
        expect(r.body.answers.q2).to.include({ choice: 'only', confidence: 1 });
        expect(r.body.answers.q3).to.include({ score: 0, confidence: 1 });
      });

      it('413 when the state is over the configured size', async () => {
        const r = await decide({ ...base, state: 'x'.repeat(3000) });
        expect(r.status).to.equal(413);
        expect(r.body.error.message).to.equal('state: is 3000 bytes, more than the limit of 2048');
      });

      it('404 naming an unknown model; 400 for a model that is not a decision model', async () => {
        const unknown = await decide({ ...base, model: 'jev-9.99' });
        expect(unknown.status).to.equal(404);
        expect(unknown.body.error.message).to.equal('Model "jev-9.99" not found');
        const chat = await decide({ ...base, model: 'sandbox/chat-1' });
        expect(chat.status).to.equal(400);
        expect(chat.body.error.message).to.equal('model: sandbox/chat-1 is a chat model, not a decision model');
      });

      it('401 without a key and 402 without credits', async () => {
        expect((await call(`${gw.url}/api/v1/systemone`, { body: base })).status).to.equal(401);
        const broke = await createTenant(gw.store, 0);
        const r = await decide(base, { key: broke.inferenceKey });
        expect(r.status).to.equal(402);
        expect(r.body.error.code).to.equal(402);
      });
    });

    describe('answers', () => {
      it("from a native System One endpoint: the provider's distributions, checked and normalized", async () => {
        const r = await decide({ model: 'jev-latest', state, questions });
        expect(r.status, JSON.stringify(r.body)).to.equal(200);
        expect(r.body.model).to.equal('typesafe/jev-1.13-20260917');
        expect(r.body.provider).to.be.oneOf(['sandbox-systemone', 'sandbox-systemone-eu']);
        expect(r.body.id).to.match(/^gen-dec-/);
        expectJsonAnswerHeaders(r);
        const direct = await fetch(`${stack.sandboxUrl}/systemone/v1/systemone`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ state, questions, model: 'jev-1.13' }),
        });
        const upstream = (await direct.json()) as any;
        expect(r.body.answers.urgent).to.deep.equal(upstream.answers.urgent);
        for (const name of ['topic', 'severity']) {
          for (const [k, v] of Object.entries<number>(upstream.answers[name].probabilities))
            expect(r.body.answers[name].probabilities[k]).to.be.closeTo(v, 1e-12);
          expect(r.body.answers[name].confidence).to.be.closeTo(upstream.answers[name].confidence, 1e-12);
        }
        expect(r.body.answers.topic.choice).to.equal(upstream.answers.topic.choice);
        expect(r.body.answers.severity.score).to.be.closeTo(upstream.answers.severity.score, 1e-12);
        expect(r.body.answers.severity.legend).to.deep.equal({ 0: 'none', 1: 'minor', 2: 'major', 3: 'critical' });
        // Priced by whichever of the model's two providers served it (the EU one costs 1.5 times as much).
        const price = r.body.provider === 'sandbox-systemone' ? { prompt: 0.5, completion: 2 } : { prompt: 0.75, completion: 3 };
        expect(r.body.usage).to.deep.equal({
          ...upstream.usage,
          cost:
            Math.round(((upstream.usage.input_tokens * price.prompt + upstream.usage.output_tokens * price.completion) / 1e6) * 1e10) /
            1e10,
        });
      });

      it("from a chat model's label log-probabilities, by the formulas", async () => {
        const r = await decide({ model: 'typesafe/jev-chat-1', state, questions, provider: { only: ['sandbox-alpha'] } });
        expect(r.status, JSON.stringify(r.body)).to.equal(200);
        expect(r.body.model).to.equal('typesafe/jev-chat-1-20261001');
        expect(r.body.provider).to.equal('sandbox-alpha');
        let inputTokens = 0;
        for (const [name, q] of Object.entries(questions)) {
          // Ask the sandbox the same question ourselves and apply the formulas by hand.
          const { body, labels } = logprobRequest(state, q as unknown as Question);
          const res = (await (
            await fetch(`${stack.sandboxUrl}/openai/v1/chat/completions`, {
              method: 'POST',
              headers: { 'content-type': 'application/json' },
              body: JSON.stringify({ ...body, model: 'sandbox-chat-small' }),
            })
          ).json()) as any;
          inputTokens += res.usage.prompt_tokens;
          const top = res.choices[0].logprobs.content[0].top_logprobs as { token: string; logprob: number }[];
          const lp = labels.map((l) => top.find((x) => x.token === l)!.logprob);
          const z = lp.reduce((s, x) => s + Math.exp(x), 0);
          const p = lp.map((x) => Math.exp(x) / z);
          const a = r.body.answers[name];
          if (q.type === 'noul') {
            expect(a).to.deep.equal({ type: 'noul', noul: a.noul });
            expect(a.noul).to.be.closeTo(p[1], 1e-12);
          } else if (q.type === 'choice') {
            const names = Object.keys(q.criteria);
            names.forEach((n, i) => expect(a.probabilities[n]).to.be.closeTo(p[i], 1e-12));
            expect(a.choice).to.equal(names[p.indexOf(Math.max(...p))]);
            expect(a.confidence).to.be.closeTo((names.length * Math.max(...p) - 1) / (names.length - 1), 1e-12);
          } else {
            expect(a.score).to.be.closeTo(
              p.reduce((s, x, i) => s + i * x, 0),
              1e-12,
            );
            const m = p.indexOf(Math.max(...p));
            const d = p.reduce((s, x, i) => s + x * Math.abs(i - m), 0);
            expect(a.confidence).to.be.closeTo(Math.max(0, 1 - d / (Math.floor(16 / 4) / 4)), 1e-12);
            expect(Object.values<number>(a.probabilities).reduce((s, x) => s + x, 0)).to.be.closeTo(1, 1e-12);
          }
        }
        expect(r.body.usage.input_tokens).to.equal(inputTokens);
        expect(r.body.usage.output_tokens).to.equal(3); // one label token per question
        await gw.usage.flushed(); // journaled before the answer; stored in the next group
        const usage = await storedRecord(gw.store, r.body.id);
        expect(usage!.details, 'stored as one text field').to.be.a('string');
        const details = usageDetails(usage!)!;
        expect(details.prompt_format).to.equal('gw-decision-v1');
        expect(Object.keys(details.label_mass as object)).to.have.members(['urgent', 'topic', 'severity']);
        for (const mass of Object.values(details.label_mass as Record<string, number>)) expect(mass).to.be.closeTo(0.97, 1e-9);
        expect(r.body).to.not.have.property('providers'); // one provider answered everything
      });

      it('questions routed to different providers: each question names its own, the response the one that answered most', async () => {
        const r = await decide({ model: `split/dec-${mode}`, state, questions, provider: { order: [`chat-first-fails-${mode}`] } });
        expect(r.status, JSON.stringify(r.body)).to.equal(200);
        // The first of the three calls to reach the flaky provider failed and fell back; the other two stayed.
        const providers = Object.values<string>(r.body.providers);
        expect(providers.sort()).to.deep.equal([`chat-first-fails-${mode}`, `chat-first-fails-${mode}`, 'sandbox-alpha']);
        expect(Object.keys(r.body.providers)).to.have.members(Object.keys(questions));
        expect(r.body.provider).to.equal(`chat-first-fails-${mode}`);
        await gw.usage.flushed();
        const usage = await storedRecord(gw.store, r.body.id);
        expect(usageDetails(usage!)!.providers).to.deep.equal(r.body.providers);
      });
    });

    describe('upstream failures', () => {
      const q = { q: { type: 'noul', instructions: 'ok?' } };
      const cases: [string, number, Record<string, unknown>][] = [
        ['test/dec-500', 502, { provider_name: 's1-500', upstream_status: 500 }],
        ['test/dec-timeout', 524, { provider_name: 's1-timeout' }],
        ['test/dec-busy', 529, { provider_name: 's1-busy', upstream_status: 529 }],
        ['test/dec-429', 429, { provider_name: 's1-429', upstream_status: 429 }],
      ];
      for (const [model, status, metadata] of cases) {
        it(`${model} → ${status} naming the provider`, async () => {
          const r = await decide({ model, state: 'x', questions: q });
          expect(r.status).to.equal(status);
          expect(r.body.error.code).to.equal(status);
          expect(r.body.error.metadata).to.include(metadata);
          if (status === 429) expect(r.headers.get('retry-after')).to.equal('20');
          // A failed decision debits nothing.
          await gw.usage.flushed();
          expect((await storedUsage(gw.store, { workspace_id: t.workspaceId })).filter((u) => u.model.startsWith('test/'))).to.deep.equal(
            [],
          );
        });
      }

      it('falls back to the next provider, and not when allow_fallbacks is false', async () => {
        const ok = await decide({ model: 'test/dec-fallback', state: 'x', questions: q });
        expect(ok.status).to.equal(200);
        expect(ok.body.provider).to.equal('sandbox-systemone');
        const strict = await decide({
          model: 'test/dec-fallback',
          state: 'x',
          questions: q,
          provider: { allow_fallbacks: false, sort: 'price' },
        });
        expect(strict.status).to.equal(502);
        expect(strict.body.error.metadata.provider_name).to.equal('s1-500');
      });

      it('404 naming the preference that excluded every endpoint', async () => {
        const r = await decide({
          model: 'jev-1.13',
          state: 'x',
          questions: q,
          provider: { data_collection: 'deny', only: ['sandbox-alpha'] },
        });
        expect(r.status).to.equal(404);
        expect(r.body.error.message).to.equal('No endpoint of typesafe/jev-1.13 satisfies provider.only');
      });
    });

    if (mode === 'inline')
      describe('cancellation (inline mode)', () => {
        const slow = { model: 'test/dec-slow', state: 'slow', questions: { q: { type: 'noul', instructions: '?' } } };
        const counted = (what: '_aborted' | '_calls') => async () =>
          ((await (await fetch(`${stack.sandboxUrl}/${what}`)).json()) as Record<string, number>)[
            'dec=1,latency=4000,tag=slow|/systemone/v1/systemone'
          ] ?? 0;
        const aborted = counted('_aborted');
        const calls = counted('_calls');

        it('a client that goes away cancels the provider call, and nothing is billed', async () => {
          const tenant = await createTenant(gw.store, 1);
          const before = await aborted();
          const callsBefore = await calls();
          const controller = new AbortController();
          const pending = fetch(`${gw.url}/api/v1/systemone`, {
            method: 'POST',
            signal: controller.signal,
            headers: { authorization: `Bearer ${tenant.inferenceKey}`, 'content-type': 'application/json' },
            body: JSON.stringify(slow),
          }).catch((err: Error) => err);
          // Hang up once the provider has the call (not after a guessed delay).
          for (let i = 0; i < 200 && (await calls()) === callsBefore; i++) await new Promise((r) => setTimeout(r, 10));
          controller.abort();
          expect(await pending).to.be.instanceOf(Error);
          // The sandbox sees its caller hang up long before its 4 s answer would have been ready.
          let seen = before;
          for (let i = 0; i < 100 && seen === before; i++) {
            await new Promise((r) => setTimeout(r, 20));
            seen = await aborted();
          }
          expect(seen).to.equal(before + 1);
          await gw.usage.flushed();
          expect(await gw.store.usage.countDocuments({ workspace_id: tenant.workspaceId })).to.equal(0);
        });

        it('a decision still running at DECISION_TIMEOUT_MS is abandoned with a 524 and the provider call cancelled', async () => {
          const before = await aborted();
          const r = await decide(slow);
          expect(r.status).to.equal(524);
          expect(r.body.error.message).to.equal('Decision did not finish within 2000 ms');
          let seen = before;
          for (let i = 0; i < 100 && seen === before; i++) {
            await new Promise((resolve) => setTimeout(resolve, 20));
            seen = await aborted();
          }
          expect(seen).to.equal(before + 1);
        });
      });

    describe('usage, credits and sessions', () => {
      it('records one usage record with session, user, trace and attribution, and debits its cost', async () => {
        const tenant = await createTenant(gw.store, 1);
        const r = await decide(
          {
            model: 'jev-1.13',
            state: 'x',
            questions: { q: { type: 'noul', instructions: 'ok?' } },
            user: 'end-user-1',
            trace: { trace_id: 'tr-1', team: 'risk' },
          },
          {
            key: tenant.inferenceKey,
            headers: {
              'x-session-id': 'sess-header',
              'http-referer': 'https://app.example',
              'x-openrouter-title': 'Risk Desk',
              'x-openrouter-categories': 'agents,cli',
            },
          },
        );
        expect(r.status).to.equal(200);
        await gw.usage.flushed(); // journaled before the answer; stored in the next group
        const doc = await storedRecord(gw.store, r.body.id);
        expect(doc).to.include({
          workspace_id: tenant.workspaceId,
          key_id: tenant.inferenceKeyId,
          kind: 'decision',
          model: 'typesafe/jev-1.13-20260917',
          provider: r.body.provider,
          session_id: 'sess-header',
          user: 'end-user-1',
        });
        expect(doc!.input_tokens).to.equal(r.body.usage.input_tokens);
        expect(doc!.cost).to.equal(r.body.usage.cost);
        expect(fromJsonText(doc!.trace!)).to.deep.equal({ trace_id: 'tr-1', team: 'risk' });
        expect(doc!.app).to.deep.equal({ referer: 'https://app.example', title: 'Risk Desk', categories: ['agents', 'cli'] });
        const credits = await call(`${gw.url}/api/v1/credits`, { key: tenant.inferenceKey });
        expect(credits.body.data.total_usage).to.be.closeTo(r.body.usage.cost, 1e-9);
        expect(credits.body.data.balance).to.be.closeTo(1 - r.body.usage.cost, 1e-9);
        const gen = await call(`${gw.url}/api/v1/generation?id=${r.body.id}`, { key: tenant.inferenceKey });
        expect(gen.body.data).to.include({ id: r.body.id, session_id: 'sess-header', app_title: 'Risk Desk' });
      });

      it('takes session_id from the body over the x-session-id header', async () => {
        const r = await decide(
          { model: 'jev-1.13', state: 'y', questions: { q: { type: 'noul', instructions: '?' } }, session_id: 'sess-body' },
          { headers: { 'x-session-id': 'sess-header' } },
        );
        await gw.usage.flushed();
        expect((await storedRecord(gw.store, r.body.id))!.session_id).to.equal('sess-body');
        const long = await decide(
          { model: 'jev-1.13', state: 'y', questions: { q: { type: 'noul', instructions: '?' } } },
          { headers: { 'x-session-id': 'h'.repeat(257) } },
        );
        expect(long.status).to.equal(400);
      });

      it(
        mode === 'workflow'
          ? 'runs each decision as a workflow whose id is the generation id'
          : 'runs decisions in-process, with no workflow',
        async () => {
          const r = await decide({ model: 'jev-1.13', state: 'z', questions: { q: { type: 'noul', instructions: '?' } } });
          expect(r.status).to.equal(200);
          expect((await call(`${gw.url}/readyz`)).body.decisions_execution).to.equal(mode);
          const { Connection, Client, WorkflowNotFoundError } = await import('@temporalio/client');
          const connection = await Connection.connect({ address: stack.temporalAddress });
          try {
            const handle = new Client({ connection }).workflow.getHandle(r.body.id);
            if (mode === 'inline') {
              await handle.describe().then(
                () => expect.fail('no workflow should exist'),
                (err) => expect(err).to.be.instanceOf(WorkflowNotFoundError),
              );
              return;
            }
            // The answer leaves as soon as the activity has it; the run's completion is recorded just after.
            expect(await handle.result()).to.deep.include({ id: r.body.id });
            const d = await handle.describe();
            expect(d.type).to.equal(decisionWorkflow.name);
            expect(d.status.name).to.equal('COMPLETED');
            // One line for the Web UI's list: what, for whom; no caller text.
            expect(await d.staticSummary()).to.equal(
              `decision · jev-1.13 · 1 question(s) · workspace ${t.workspaceId} · key ${t.inferenceKeyId}`,
            );
          } finally {
            await connection.close();
          }
        },
      );
    });

    describe('@openrouter/sdk compatibility', () => {
      it('systemOne.create returns parsed answers for all three question types', async () => {
        const { OpenRouter } = await import('@openrouter/sdk');
        const sdk = new OpenRouter({ apiKey: t.inferenceKey, serverURL: `${gw.url}/api/v1` });
        const res = await sdk.systemOne.create({
          decisionsRequest: { model: 'jev-1.13', state, questions: questions as any, sessionId: 'sdk-session' },
        });
        expect(res.model).to.equal('typesafe/jev-1.13-20260917');
        expect(res.answers.urgent.type).to.equal('noul');
        expect((res.answers.topic as any).choice).to.be.oneOf(['billing', 'bug', 'account']);
        expect((res.answers.severity as any).score).to.be.within(0, 3);
        expect(res.usage.inputTokens).to.be.greaterThan(0);
        await gw.usage.flushed();
        expect((await storedRecord(gw.store, res.id!))!.session_id).to.equal('sdk-session');
      });

      it("raises the SDK's typed errors for 400, 401, 402 and 404", async () => {
        const sdkModule = await import('@openrouter/sdk');
        // A subpath export, which this project's node10 module resolution cannot type; the runtime resolves it.
        const errorsPath = '@openrouter/sdk/models/errors';
        const errors: any = await import(errorsPath);
        const broke = await createTenant(gw.store, 0);
        const make = (apiKey: string) => new sdkModule.OpenRouter({ apiKey, serverURL: `${gw.url}/api/v1` });
        const attempt = async (apiKey: string, request: any) => {
          try {
            await make(apiKey).systemOne.create({ decisionsRequest: request });
          } catch (err) {
            return err;
          }
          throw new Error('expected an error');
        };
        const good = { model: 'jev-1.13', state: 'x', questions: { q: { type: 'noul', instructions: '?' } } };
        expect(
          await attempt(t.inferenceKey, { ...good, questions: { q: { type: 'score', instructions: '?', criteria: [] } } }),
        ).to.be.instanceOf(errors.BadRequestResponseError);
        expect(await attempt(`sk-gw-v1-${'0'.repeat(64)}`, good)).to.be.instanceOf(errors.UnauthorizedResponseError);
        expect(await attempt(broke.inferenceKey, good)).to.be.instanceOf(errors.PaymentRequiredResponseError);
        expect(await attempt(t.inferenceKey, { ...good, model: 'no-such-model' })).to.be.instanceOf(errors.NotFoundResponseError);
      });
    });
  });

describe('decision models in the default catalog', () => {
  it('a native decision falls back to the second provider when the first fails', async () => {
    // The default catalog, with its first System One provider answering 503.
    const catalogPath = writeTestCatalog('decision-fallback', (base) => {
      const first = base.providers.find((p) => p.slug === 'sandbox-systemone');
      first.base_url = '${SANDBOX_URL}/~decfallback=1,status=503/systemone';
    });
    const gw = await startTestGateway({ withWorker: false, env: { CATALOG_PATH: catalogPath } });
    try {
      const t = await createTenant(gw.store, 1);
      for (let i = 0; i < 5; i++) {
        const r = await call(`${gw.url}/api/v1/systemone`, {
          key: t.inferenceKey,
          body: { model: 'jev-1.13', state: `x${i}`, questions: { q: { type: 'noul', instructions: 'ok?' } } },
        });
        expect(r.status, JSON.stringify(r.body)).to.equal(200);
        expect(r.body.provider).to.equal('sandbox-systemone-eu');
      }
    } finally {
      await gw.stop();
    }
  });
});

describe('decisions on chat models: what one request may send upstream', () => {
  it('a state sent once per question is bounded by BODY_LIMIT in all: 413 over it, with nothing called or billed; native models and requests within it are answered', async () => {
    // jev-chat-1's providers, tagged so that this test's calls can be counted.
    const catalogPath = writeTestCatalog('decision-fanout', (base) => {
      for (const p of base.providers)
        if (p.slug === 'sandbox-alpha' || p.slug === 'sandbox-beta') p.base_url = '${SANDBOX_URL}/~decfanout=1/openai/v1';
    });
    const gw = await startTestGateway({ withWorker: false, env: { CATALOG_PATH: catalogPath, BODY_LIMIT: '64kb' } });
    try {
      const t = await createTenant(gw.store, 5);
      const state = 'x'.repeat(20_000);
      const asked = (model: string, n: number) =>
        call(`${gw.url}/api/v1/systemone`, {
          key: t.inferenceKey,
          body: {
            model,
            state,
            questions: Object.fromEntries(Array.from({ length: n }, (_, i) => [`q${i}`, { type: 'noul', instructions: `${i}?` }])),
          },
        });
      const over = await asked('jev-chat-1', 4);
      expect(over.status, JSON.stringify(over.body)).to.equal(413);
      expect(over.body.error.message).to.equal(
        'state: typesafe/jev-chat-1 is asked once per question, so its 20000-byte state would be sent 4 times (80000 bytes), more than the limit of 65536; send fewer questions per request or a smaller state',
      );
      expect(await providerCalls('decfanout=1')).to.equal(0);
      expect(await storedUsage(gw.store, { workspace_id: t.workspaceId })).to.have.length(0);

      const within = await asked('jev-chat-1', 3);
      expect(within.status, JSON.stringify(within.body)).to.equal(200);
      expect(Object.keys(within.body.answers)).to.have.length(3);
      expect(await providerCalls('decfanout=1')).to.equal(3);
      // A native endpoint is sent the state once, whatever the number of questions.
      expect((await asked('jev-1.13', 4)).status).to.equal(200);
    } finally {
      await gw.stop();
    }
  });
});

/** Calls the sandbox has had whose fault spec holds `tag`. */
const providerCalls = async (tag: string) =>
  Object.entries((await (await fetch(`${stack.sandboxUrl}/_calls`)).json()) as Record<string, number>)
    .filter(([k]) => k.includes(tag))
    .reduce((a, [, n]) => a + n, 0);

/** A catalog with `test/dec-<name>`: jev-1.13 on a sandbox provider of its own with `faults` (devstack/sandbox/server.ts). */
function faultyDecisionCatalog(name: string, faults: string): string {
  return writeTestCatalog(`decision-${name}`, (base) => {
    const native = base.providers.find((p) => p.slug === 'sandbox-systemone');
    base.providers.push({ ...native, slug: `${name}-systemone`, base_url: `\${SANDBOX_URL}/~dec${name}=1,${faults}/systemone` });
    const jev = base.models.find((m) => m.id === 'typesafe/jev-1.13');
    base.models.push({
      ...jev,
      id: `test/dec-${name}`,
      family: `test/dec-${name}`,
      endpoints: [{ ...jev.endpoints[0], provider: `${name}-systemone` }],
    });
  });
}

describe('decisions as workflows under one workspace’s flood', function () {
  this.timeout(60_000);
  it('leave another workspace a quarter of the slots: its decision starts at once, not behind the flood', async () => {
    const catalogPath = faultyDecisionCatalog('flood', 'latency=1000');
    // 4 decisions at once per process: one workspace may run 3.
    const gw = await startTestGateway({
      env: { CATALOG_PATH: catalogPath, DECISIONS_EXECUTION: 'workflow', DECISION_WORKFLOW_CONCURRENCY: '4' },
    });
    try {
      const hog = await createTenant(gw.store, 5);
      const other = await createTenant(gw.store, 5);
      const decide = (key: string, i: number) =>
        call(`${gw.url}/api/v1/systemone`, {
          key,
          body: { model: 'test/dec-flood', state: `flood ${i}`, questions: { q: { type: 'noul', instructions: 'ok?' } } },
        });
      let hogDone = 0;
      const flood = Array.from({ length: 12 }, (_, i) => decide(hog.inferenceKey, i).then((r) => (hogDone++, r)));
      await new Promise((r) => setTimeout(r, 100));
      const answered = await decide(other.inferenceKey, 0);
      expect(answered.status, JSON.stringify(answered.body)).to.equal(200);
      // Its decision ran beside the flood's first three: first come, first served, it waited for 8.
      expect(hogDone, 'decisions of the flood answered before it').to.be.at.most(4);
      for (const r of await Promise.all(flood)) expect(r.status).to.equal(200);
    } finally {
      await gw.stop();
    }
  });
});

describe('decisions as workflows whose start does not answer', function () {
  this.timeout(60_000);
  let gw: TestGateway;
  let t: Tenant;
  const body = { model: 'jev-1.13', state: 'lost', questions: { q: { type: 'noul', instructions: 'ok?' } } };
  before(async () => {
    // A start or a describe unanswered for 1.5 s is given up (10 s in production).
    gw = await startTestGateway({ env: { DECISIONS_EXECUTION: 'workflow' }, tune: (c) => (c.temporal.answerWithinMs = 1_500) });
    t = await createTenant(gw.store, 5);
  });
  after(async () => {
    await gw.stop();
  });

  /** Runs `fn` with the next workflow start made to throw, after reaching the server (`reaches`) or before. */
  async function withLostStart<T>(reaches: boolean, fn: () => Promise<T>): Promise<{ result: T; id: string | null }> {
    const start = WorkflowClient.prototype.start;
    let id: string | null = null;
    WorkflowClient.prototype.start = async function (this: WorkflowClient, ...args: Parameters<typeof start>) {
      WorkflowClient.prototype.start = start;
      if (reaches) id = (await start.apply(this, args)).workflowId;
      throw new Error('the answer was lost');
    } as typeof start;
    try {
      return { result: await fn(), id };
    } finally {
      WorkflowClient.prototype.start = start;
    }
  }

  it('a start that reached the server, its answer lost, is answered by the run (before: a 500, and the decision billed all the same)', async () => {
    const { result: r, id } = await withLostStart(true, () => call(`${gw.url}/api/v1/systemone`, { key: t.inferenceKey, body }));
    expect(r.status, JSON.stringify(r.body)).to.equal(200);
    expect(r.body.id).to.equal(id);
    expect(r.body.answers.q).to.include({ type: 'noul' });
    expect(await storedUsage(gw.store, { _id: id! })).to.have.length(1);
  });

  it('a start the server takes only after 1.5 s (a frozen server) is a 503 at 1.5 s, and the run it starts then decides nothing (before: the request waited as long as the server was frozen)', async () => {
    const before = await storedUsage(gw.store, { workspace_id: t.workspaceId });
    const start = WorkflowClient.prototype.start;
    let landed: Promise<string> | null = null;
    WorkflowClient.prototype.start = function (this: WorkflowClient, ...args: Parameters<typeof start>) {
      WorkflowClient.prototype.start = start;
      const late = new Promise((res) => setTimeout(res, 2_500)).then(() => start.apply(this, args));
      landed = late.then((h) => h.workflowId);
      return late;
    } as typeof start;
    const began = Date.now();
    try {
      const r = await call(`${gw.url}/api/v1/systemone`, { key: t.inferenceKey, body });
      expect(r.status, JSON.stringify(r.body)).to.equal(503);
      // Not found when asked (it had not landed): a start that failed.
      expect(r.body.error.message).to.equal('The decision could not be started; try again');
      expect(Date.now() - began).to.be.within(1_400, 2_400);
    } finally {
      WorkflowClient.prototype.start = start;
    }
    const id = await landed!;
    // The run began after its start was due, and refused itself (not this process's refusal of its attempt).
    const connection = await Connection.connect({ address: stack.temporalAddress });
    try {
      const failure = await new Client({ connection }).workflow
        .getHandle(id)
        .result()
        .then(
          () => null,
          (e: Error & { cause?: Error }) => e.cause?.message,
        );
      expect(failure).to.equal('The decision could not be started in time; try again');
    } finally {
      await connection.close();
    }
    expect(await storedUsage(gw.store, { workspace_id: t.workspaceId })).to.have.length(before.length);
  });

  it('a lost start the server is then not asked about in time is a 503 at the bound, not a wait as long as the server is frozen', async () => {
    const getHandle = WorkflowClient.prototype.getHandle;
    WorkflowClient.prototype.getHandle = function (this: WorkflowClient, ...args: Parameters<typeof getHandle>) {
      WorkflowClient.prototype.getHandle = getHandle;
      const handle = getHandle.apply(this, args);
      const describe = handle.describe.bind(handle);
      return { ...handle, describe: () => new Promise((res) => setTimeout(res, 2_500)).then(describe) };
    } as typeof getHandle;
    const began = Date.now();
    try {
      const { result: r } = await withLostStart(false, () => call(`${gw.url}/api/v1/systemone`, { key: t.inferenceKey, body }));
      expect(r.status, JSON.stringify(r.body)).to.equal(503);
      expect(r.body.error.message).to.equal('The orchestration service is unavailable; try again');
      expect(Date.now() - began).to.be.within(1_400, 2_400);
    } finally {
      WorkflowClient.prototype.getHandle = getHandle;
    }
  });

  it('a start that never reached the server is a 503, and nothing is billed', async () => {
    const before = await storedUsage(gw.store, { workspace_id: t.workspaceId });
    const { result: r } = await withLostStart(false, () => call(`${gw.url}/api/v1/systemone`, { key: t.inferenceKey, body }));
    expect(r.status, JSON.stringify(r.body)).to.equal(503);
    expect(r.body.error.message).to.equal('The decision could not be started; try again');
    await new Promise((res) => setTimeout(res, 500));
    expect(await storedUsage(gw.store, { workspace_id: t.workspaceId })).to.have.length(before.length);
  });
});

describe('decisions as workflows stopped in Temporal', function () {
  this.timeout(60_000);
  let gw: TestGateway;
  let t: Tenant;
  let connection: Connection;
  before(async () => {
    const catalogPath = faultyDecisionCatalog('stopped', 'latency=3000');
    gw = await startTestGateway({ env: { CATALOG_PATH: catalogPath, DECISIONS_EXECUTION: 'workflow' } });
    t = await createTenant(gw.store, 5);
    connection = await Connection.connect({ address: stack.temporalAddress });
  });
  after(async () => {
    await connection.close();
    await gw.stop();
  });

  for (const how of ['terminate', 'cancel'] as const) {
    it(`a decision whose run an operator ${how}s while it decides is answered by the decision it made, billed once (before: a 500, billed all the same)`, async () => {
      const start = WorkflowClient.prototype.start;
      let id: string | null = null;
      WorkflowClient.prototype.start = async function (this: WorkflowClient, ...args: Parameters<typeof start>) {
        WorkflowClient.prototype.start = start;
        const handle = await start.apply(this, args);
        id = handle.workflowId;
        return handle;
      } as typeof start;
      try {
        const pending = call(`${gw.url}/api/v1/systemone`, {
          key: t.inferenceKey,
          body: { model: 'test/dec-stopped', state: `stopped ${how}`, questions: { q: { type: 'noul', instructions: 'ok?' } } },
        });
        for (let i = 0; i < 50 && !id; i++) await new Promise((r) => setTimeout(r, 20));
        await new Promise((r) => setTimeout(r, 300));
        const handle = new Client({ connection }).workflow.getHandle(id!);
        await (how === 'terminate' ? handle.terminate('an operator') : handle.cancel());
        const r = await pending;
        expect(r.status, JSON.stringify(r.body)).to.equal(200);
        expect(r.body.id).to.equal(id);
        expect(r.body.answers.q).to.include({ type: 'noul' });
        expect(await storedUsage(gw.store, { _id: id! })).to.have.length(1);
        if (how === 'terminate') expect((await handle.describe()).status.name).to.equal('TERMINATED');
      } finally {
        WorkflowClient.prototype.start = start;
      }
    });
  }
});

describe('decisions as workflows stopped between two attempts', function () {
  this.timeout(60_000);
  it('a run stopped after a failed attempt is a 503, and its next attempt does not run: the provider is not called, nothing is billed (before: called and billed after the 503)', async () => {
    const gw = await startTestGateway({
      env: { CATALOG_PATH: faultyDecisionCatalog('retried', 'latency=300'), DECISIONS_EXECUTION: 'workflow' },
    });
    const connection = await Connection.connect({ address: stack.temporalAddress });
    const decide = DecisionHandoff.prototype.decide;
    let stopped: string | null = null;
    // The first attempt fails as a store that does not answer would (a retryable failure: the local
    // activity is tried again 200 ms later), and an operator terminates the run right then.
    DecisionHandoff.prototype.decide = function (this: DecisionHandoff, generationId: string, attempt: () => Promise<DecisionResult>) {
      return decide.call(this, generationId, async () => {
        if (stopped) return attempt();
        stopped = generationId;
        await new Client({ connection }).workflow.getHandle(generationId).terminate('an operator');
        throw new Error('the store did not answer');
      });
    };
    try {
      const t = await createTenant(gw.store, 5);
      const r = await call(`${gw.url}/api/v1/systemone`, {
        key: t.inferenceKey,
        body: { model: 'test/dec-retried', state: 'stopped between attempts', questions: { q: { type: 'noul', instructions: 'ok?' } } },
      });
      expect(r.status, JSON.stringify(r.body)).to.equal(503);
      expect(r.body.error.message).to.match(/stopped/);
      expect(stopped).to.be.a('string');
      // Past the retry's 200 ms and its 300 ms call.
      await new Promise((res) => setTimeout(res, 1500));
      expect(await providerCalls('decretried=1')).to.equal(0);
      expect(await storedUsage(gw.store, { _id: stopped! })).to.have.length(0);
    } finally {
      DecisionHandoff.prototype.decide = decide;
      await connection.close();
      await gw.stop();
    }
  });
});
