// GET /metrics after real traffic: a decision, an upstream failure with a fallback, a batch, a 402,
// a 429 and a thousand unknown paths; labels carry neither keys nor prompts, and stay few.
import { expect } from 'chai';
import { getBalance } from '../domain/accounts/credits';
import { endpointEntry, modelEntry, providerEntry } from '../domain/catalog/entries';
import { questions, state } from './decision-sample';
import {
  clearOfWindowEdge,
  call,
  createTenant,
  startTestGateway,
  uniqueName,
  waitForStatus,
  writeTestCatalog,
  type Tenant,
  type TestGateway,
} from './helpers';
import { capturingLogger } from './capture-log';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { freePort } from '../devstack/processes';
import { stack } from './fixture';

interface Sample {
  labels: Record<string, string>;
  value: number;
}

/** The samples of one metric in Prometheus' text format. */
function samples(text: string, name: string): Sample[] {
  const out: Sample[] = [];
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    const m = /^[^{ ]+(?:\{(.*)\})? (\S+)$/.exec(line)!;
    const labels: Record<string, string> = {};
    for (const [, k, v] of (m[1] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[k] = v;
    out.push({ labels, value: Number(m[2]) });
  }
  return out;
}

const valueOf = (text: string, name: string, labels: Record<string, string> = {}) =>
  samples(text, name)
    .filter((s) => Object.entries(labels).every(([k, v]) => s.labels[k] === v))
    .reduce((sum, s) => sum + s.value, 0);

const PROMPT = `a prompt nobody should find in metrics ${uniqueName('p')}`;

describe('metrics', function () {
  this.timeout(120_000);
  let gw: TestGateway;
  let t: Tenant;
  let text: string;
  const captured = capturingLogger('info');

  before(async () => {
    const run = uniqueName('metrics');
    const catalog = writeTestCatalog('metrics', (c) => {
      const provider = (slug: string, faults: string) =>
        providerEntry(slug, `\${SANDBOX_URL}/~run=${run}${faults}/openai/v1`, { max_concurrency: 10 });
      c.providers.push(provider('m-broken', ',status=500'), provider('m-good', ''), provider('m-slow', ',latency=3000'));
      const endpoint = (slug: string, price: number) => endpointEntry(slug, price, { supported_parameters: ['max_tokens'] });
      c.models.push(modelEntry('test/metered', [endpoint('m-broken', 1), endpoint('m-good', 2)], { released: '20260301' }));
      c.models.push(modelEntry('test/slow-metered', [endpoint('m-slow', 1)], { released: '20260301' }));
    });
    await clearOfWindowEdge();
    gw = await startTestGateway({
      logger: captured.logger,
      env: { CATALOG_PATH: catalog, RATE_LIMIT_REQUESTS: '100', RATE_LIMIT_WINDOW_SECONDS: '3600' },
    });
    t = await createTenant(gw.store, 20);
    const api = `${gw.url}/api/v1`;

    const decision = await call(`${api}/systemone`, { key: t.inferenceKey, body: { model: 'typesafe/jev-1.13', state, questions } });
    expect(decision.status, JSON.stringify(decision.body)).to.equal(200);
    const chat = await call(`${api}/chat/completions`, {
      key: t.inferenceKey,
      body: {
        model: 'test/metered',
        messages: [{ role: 'user', content: PROMPT }],
        max_tokens: 4,
        provider: { order: ['m-broken', 'm-good'] },
      },
    });
    expect(chat.status, JSON.stringify(chat.body)).to.equal(200);
    expect(chat.body.provider).to.equal('m-good');
    // A client that gives up on a slow call: counted as closed by the client (499), logged at info.
    const gaveUp = await fetch(`${api}/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${t.inferenceKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'test/slow-metered', messages: [{ role: 'user', content: 'x' }], max_tokens: 4 }),
      signal: AbortSignal.timeout(300),
    }).catch((err: Error) => err);
    expect(gaveUp).to.be.instanceOf(Error);
    for (let i = 0; i < 100 && !captured.lines.some((l) => l.msg === 'client closed the request'); i++)
      await new Promise((r) => setTimeout(r, 20));
    const batch = await call(`${api}/batches`, {
      key: t.inferenceKey,
      body: {
        endpoint: '/v1/embeddings',
        model: 'sandbox/embed-1',
        requests: [
          { custom_id: 'ok', body: { input: PROMPT, dimensions: 4 } },
          { custom_id: 'bad', body: { input: 'x', dimensions: 5000 } }, // refused by the provider: a failed line
        ],
      },
    });
    expect(batch.status, JSON.stringify(batch.body)).to.equal(202);
    await waitForStatus(gw.url, t.inferenceKey, batch.body.id, ['completed']);

    const broke = await createTenant(gw.store, 0);
    const poor = await call(`${api}/systemone`, { key: broke.inferenceKey, body: { model: 'typesafe/jev-1.13', state, questions } });
    expect(poor.status).to.equal(402);

    const busy = await createTenant(gw.store, 1);
    let limited = 0;
    for (let i = 0; i < 102; i++) if ((await call(`${api}/credits`, { key: busy.inferenceKey })).status === 429) limited++;
    expect(limited).to.equal(2);

    for (let i = 0; i < 1000; i += 50) {
      await Promise.all(Array.from({ length: 50 }, (_, j) => fetch(`${gw.url}/no/such/path/${i + j}?q=${PROMPT}`).then((r) => r.text())));
    }
    const res = await fetch(`${gw.url}/metrics`);
    expect(res.status).to.equal(200);
    expect(res.headers.get('content-type')).to.match(/^text\/plain/);
    text = await res.text();
  });
  after(async () => {
    await gw?.stop();
  });

  it('times HTTP requests by route template and status', () => {
    expect(
      valueOf(text, 'gateway_http_request_duration_seconds_count', { route: '/api/v1/systemone', status: '200', method: 'POST' }),
    ).to.equal(1);
    expect(valueOf(text, 'gateway_http_request_duration_seconds_count', { route: '/api/v1/chat/completions', status: '200' })).to.equal(1);
    expect(valueOf(text, 'gateway_http_request_duration_seconds_count', { route: '/api/v1/batches/:id', status: '200' })).to.be.at.least(1);
    expect(valueOf(text, 'gateway_http_request_duration_seconds_count', { route: '/api/v1/credits', status: '429' })).to.equal(2);
    expect(valueOf(text, 'gateway_http_request_duration_seconds_count', { route: 'unmatched', status: '404' })).to.equal(1000);
  });

  it('counts a call its client gave up on as 499, not as an upstream failure, and logs it at info', () => {
    expect(valueOf(text, 'gateway_http_request_duration_seconds_count', { route: '/api/v1/chat/completions', status: '499' })).to.equal(1);
    expect(valueOf(text, 'gateway_http_request_duration_seconds_count', { route: '/api/v1/chat/completions', status: '502' })).to.equal(0);
    const closed = captured.lines.filter((l) => l.msg === 'client closed the request');
    expect(closed).to.have.length(1);
    expect(closed[0].level).to.equal(30);
    expect(captured.lines.filter((l) => (l.level as number) >= 50)).to.deep.equal([]);
  });

  it('keeps the label set small under a thousand distinct unknown paths', () => {
    const series = samples(text, 'gateway_http_request_duration_seconds_count');
    expect(series.length).to.be.below(30);
    expect(new Set(series.map((s) => s.labels.route)).size).to.be.below(10);
  });

  it('times upstream calls by provider, model and outcome, and counts the fallback', () => {
    const failed = { provider: 'm-broken', model: 'test/metered-20260301', outcome: 'http' };
    expect(valueOf(text, 'gateway_upstream_request_duration_seconds_count', failed)).to.equal(1);
    expect(valueOf(text, 'gateway_upstream_request_duration_seconds_count', { provider: 'm-good', outcome: 'ok' })).to.equal(1);
    expect(
      valueOf(text, 'gateway_upstream_request_duration_seconds_count', { model: 'typesafe/jev-1.13-20260917', outcome: 'ok' }),
    ).to.equal(1);
    expect(valueOf(text, 'gateway_fallbacks_total', { model: 'test/metered-20260301' })).to.equal(1);
  });

  it("reads the usage ledger's backlog, the journal's state and the log lines dropped at each scrape", () => {
    // One series each (a missing one would read as 0), journal and stdout at rest.
    for (const name of ['gateway_usage_unstored_bytes', 'gateway_usage_journal_failing', 'gateway_log_lines_dropped_total'])
      expect(samples(text, name), name).to.have.length(1);
    expect(valueOf(text, 'gateway_usage_unstored_bytes')).to.be.at.least(0);
    expect(valueOf(text, 'gateway_usage_journal_failing')).to.equal(0);
    expect(valueOf(text, 'gateway_log_lines_dropped_total')).to.equal(0);
  });

  it('counts 402s, rate-limit rejections and decisions by mode', () => {
    expect(valueOf(text, 'gateway_payment_required_total')).to.be.at.least(1);
    expect(valueOf(text, 'gateway_rate_limit_rejections_total', { scope: 'key' })).to.equal(2);
    expect(valueOf(text, 'gateway_decisions_total', { mode: 'inline' })).to.equal(1);
  });

  it('counts batch lines by outcome, and batches created and finished by status', () => {
    expect(valueOf(text, 'gateway_batch_lines_total', { outcome: 'completed' })).to.equal(1);
    expect(valueOf(text, 'gateway_batch_lines_total', { outcome: 'failed' })).to.equal(1);
    expect(valueOf(text, 'gateway_batches_created_total')).to.equal(1);
    expect(valueOf(text, 'gateway_batches_finished_total', { status: 'completed' })).to.equal(1);
  });

  it("adds up each workspace's spend as the ledger does", async () => {
    const { total_usage } = await getBalance(gw.store, t.workspaceId);
    expect(total_usage).to.be.greaterThan(0);
    expect(valueOf(text, 'gateway_spend_usd_total', { workspace: t.workspaceId })).to.be.closeTo(total_usage, 1e-6);
  });

  it('carries no key and no prompt text in any label', () => {
    for (const secret of [t.inferenceKey, t.managementKey, PROMPT, 'no/such/path']) expect(text).to.not.include(secret);
  });

  it('a worker alone serves its metrics on METRICS_PORT, and the Temporal SDK its own on TEMPORAL_METRICS_PORT', async function () {
    this.timeout(60_000);
    const [port, temporalPort] = [await freePort(), await freePort()];
    const worker = spawn(process.execPath, [path.resolve(__dirname, '..', '..', 'bin', 'gateway.js'), 'worker'], {
      env: {
        ...process.env,
        MONGODB_URI: stack.mongoUri,
        MONGODB_DATABASE: uniqueName('db').replace(/-/g, '_'),
        TEMPORAL_ADDRESS: stack.temporalAddress,
        TEMPORAL_TASK_QUEUE: uniqueName('tq'),
        METRICS_PORT: String(port),
        TEMPORAL_METRICS_PORT: String(temporalPort),
        LOG_LEVEL: 'warn',
      },
      stdio: 'ignore',
    });
    try {
      const scrape = async (at: number) => {
        for (let i = 0; i < 300; i++) {
          const r = await fetch(`http://127.0.0.1:${at}/metrics`).catch(() => null);
          if (r?.ok) return r.text();
          await new Promise((res) => setTimeout(res, 100));
        }
        throw new Error(`nothing on port ${at}`);
      };
      expect(await scrape(port))
        .to.include('gateway_batch_lines_total')
        .and.include('gateway_process_cpu_seconds_total');
      // The SDK core's own: worker polls and task slots, named temporal_*.
      expect(await scrape(temporalPort)).to.match(/^temporal_\w+/m);
    } finally {
      worker.kill('SIGTERM');
      await new Promise((r) => worker.once('exit', r));
    }
  });

  it('an API listening beyond loopback without METRICS_TOKEN does not serve /metrics (it names every workspace and its spend)', async () => {
    const open = await startTestGateway({ withWorker: false, env: { HOST: '0.0.0.0' } });
    try {
      const port = new URL(open.url).port;
      const r = await fetch(`http://127.0.0.1:${port}/metrics`);
      expect(r.status).to.equal(404);
      expect(await r.text()).to.not.include('gateway_spend');
    } finally {
      await open.stop();
    }
  });

  it('with METRICS_TOKEN and METRICS_PORT: its own port, behind the token, and not on the API', async () => {
    const port = await freePort();
    const guarded = await startTestGateway({ withWorker: false, env: { METRICS_TOKEN: 'scrape-secret', METRICS_PORT: String(port) } });
    try {
      const at = `http://127.0.0.1:${port}/metrics`;
      const none = await fetch(at);
      expect(none.status).to.equal(401);
      expect(((await none.json()) as any).error.code).to.equal(401);
      expect((await fetch(at, { headers: { authorization: 'Bearer wrong' } })).status).to.equal(401);
      const ok = await fetch(at, { headers: { authorization: 'Bearer scrape-secret' } });
      expect(ok.status).to.equal(200);
      expect(await ok.text()).to.include('gateway_http_request_duration_seconds');
      expect((await fetch(`${guarded.url}/metrics`)).status).to.equal(404);
    } finally {
      await guarded.stop();
    }
  });
});
