// Batch completion webhooks against a real local receiver: signed per Standard Webhooks, delivered
// once, retried after 500s and timeouts, given up after the window; private URLs refused at create.
import http from 'node:http';
import net from 'node:net';
import type { AddressInfo } from 'node:net';
import { createHmac } from 'node:crypto';
import { expect } from 'chai';
import { Client, Connection } from '@temporalio/client';
import { stack } from './fixture';
import { call, createTenant, startTestGateway, waitForStatus, type Tenant, type TestGateway } from './helpers';

interface Received {
  path: string;
  headers: http.IncomingHttpHeaders;
  body: string;
}

/** A receiver whose answers per path are scripted: a status, or 'hang' (never answers in time). */
function receiver(script: Record<string, (number | 'hang')[]>) {
  const received: Received[] = [];
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      const path = req.url ?? '/';
      const seen = received.filter((r) => r.path === path).length;
      received.push({ path, headers: req.headers, body });
      const plan = script[path] ?? [200];
      const answer = plan[Math.min(seen, plan.length - 1)];
      if (answer === 'hang') {
        setTimeout(() => res.writeHead(200).end(), 3_000).unref();
        return;
      }
      res.writeHead(answer, { 'content-type': 'text/plain', ...(answer === 302 && { location: '/ok' }) }).end(String(answer));
    });
  });
  return {
    received,
    listen: () =>
      new Promise<string>((r) => server.listen(0, '127.0.0.1', () => r(`http://127.0.0.1:${(server.address() as AddressInfo).port}`))),
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

/** Verifies a delivery as a Standard Webhooks library would. */
function verify(secret: string, r: Received): boolean {
  const id = String(r.headers['webhook-id']);
  const ts = String(r.headers['webhook-timestamp']);
  const key = Buffer.from(secret.replace(/^whsec_/, ''), 'base64');
  const expected = `v1,${createHmac('sha256', key).update(`${id}.${ts}.${r.body}`).digest('base64')}`;
  return String(r.headers['webhook-signature'])
    .split(' ')
    .some((s) => s === expected);
}

async function until<T>(what: string, f: () => Promise<T | undefined> | T | undefined, timeoutMs = 30_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await f();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe('batch completion webhooks', function () {
  this.timeout(90_000);
  const rx = receiver({ '/flaky': [500, 500, 200], '/slow': ['hang', 200], '/down': [500], '/moved': [302], '/stopped': [500] });
  let base: string;
  let gw: TestGateway;
  let t: Tenant;
  let secret: string;

  const lines = [{ custom_id: 'a', body: { input: 'hello', dimensions: 2 } }];
  const createWith = (callback: string, key = t.inferenceKey, at = gw) =>
    call(`${at.url}/api/v1/batches`, {
      key,
      body: { endpoint: '/v1/embeddings', model: 'sandbox/embed-1', requests: lines, callback_url: callback },
    });
  /** The batch once its webhook has an outcome. */
  const settled = (id: string) =>
    until(`webhook outcome of ${id}`, async () => {
      const b = (await call(`${gw.url}/api/v1/batches/${id}`, { key: t.inferenceKey })).body;
      return b.webhook ? b : undefined;
    });

  before(async () => {
    base = await rx.listen();
    gw = await startTestGateway({
      env: {
        WEBHOOKS_ALLOW_PRIVATE_URLS: 'true',
        // Room for three attempts 100 and 200 ms apart even when Temporal schedules each slowly (a loaded machine).
        WEBHOOK_RETRY_WINDOW_MS: '4000',
        WEBHOOK_TIMEOUT_MS: '400',
      },
      tune: (c) => (c.webhooks.firstRetryMs = 100),
    });
    t = await createTenant(gw.store, 5);
    const s = await call(`${gw.url}/api/v1/webhooks/secret`, { key: t.managementKey });
    expect(s.status).to.equal(200);
    secret = s.body.data.secret;
    expect(secret).to.match(/^whsec_[A-Za-z0-9+/]{43}=$/);
  });
  after(async () => {
    await gw?.stop();
    await rx.close();
  });

  it('posts the terminal batch once, signed with the workspace secret, and records the delivery', async () => {
    const r = await createWith(`${base}/ok`);
    expect(r.status, JSON.stringify(r.body)).to.equal(202);
    expect(r.body.callback_url).to.equal(`${base}/ok`);
    const b = await settled(r.body.id);
    expect(b.webhook).to.deep.equal({ status: 'delivered', attempts: 1, last_status: 200, last_error: null });
    const got = rx.received.filter((x) => x.path === '/ok');
    expect(got).to.have.length(1);
    expect(verify(secret, got[0]), 'signature').to.equal(true);
    expect(got[0].headers['webhook-id']).to.equal(`msg_${r.body.id}`);
    expect(Math.abs(Number(got[0].headers['webhook-timestamp']) - Date.now() / 1000)).to.be.below(60);
    const payload = JSON.parse(got[0].body);
    expect(payload).to.include({ id: r.body.id, object: 'batch', status: 'completed', results: null });
    expect(payload.request_counts).to.deep.equal({ total: 1, completed: 1, failed: 0 });
    // Tampering with the body breaks the signature.
    expect(verify(secret, { ...got[0], body: got[0].body.replace('completed', 'failed') })).to.equal(false);
  });

  it('retries after 500s with the same webhook id, each attempt in the workflow history', async () => {
    const r = await createWith(`${base}/flaky`);
    const b = await settled(r.body.id);
    expect(b.webhook).to.deep.include({ status: 'delivered', attempts: 3, last_status: 200 });
    const got = rx.received.filter((x) => x.path === '/flaky');
    expect(got).to.have.length(3);
    expect(new Set(got.map((x) => x.headers['webhook-id']))).to.deep.equal(new Set([`msg_${r.body.id}`]));
    for (const x of got) expect(verify(secret, x)).to.equal(true);
    const connection = await Connection.connect({ address: stack.temporalAddress });
    try {
      const history = await new Client({ connection }).workflow.getHandle(r.body.id).fetchHistory();
      const attempts = (history.events ?? []).filter(
        (e) => e.activityTaskScheduledEventAttributes?.activityType?.name === 'deliverBatchWebhook',
      );
      expect(attempts).to.have.length(3);
    } finally {
      await connection.close();
    }
  });

  it('retries after a timeout', async () => {
    const r = await createWith(`${base}/slow`);
    const b = await settled(r.body.id);
    expect(b.webhook).to.deep.include({ status: 'delivered', attempts: 2, last_status: 200 });
    expect(rx.received.filter((x) => x.path === '/slow')).to.have.length(2);
  });

  it('gives up once the window has passed and records the outcome', async () => {
    const r = await createWith(`${base}/down`);
    const b = await settled(r.body.id);
    expect(b.status).to.equal('completed');
    expect(b.webhook).to.deep.include({ status: 'failed', last_status: 500, last_error: 'HTTP 500' });
    expect(b.webhook.attempts).to.be.at.least(2);
    expect(rx.received.filter((x) => x.path === '/down')).to.have.length(b.webhook.attempts);
  });

  it('a batch whose run an operator stops while it retries the webhook has the delivery recorded as given up (before: no record for good)', async () => {
    const watching = await startTestGateway({
      env: { WEBHOOKS_ALLOW_PRIVATE_URLS: 'true', WEBHOOK_TIMEOUT_MS: '400', BATCH_STOPPED_RUNS_EVERY_MS: '300' },
      tune: (c) => (c.webhooks.firstRetryMs = 100), // and the default window of a day: it keeps retrying
    });
    const connection = await Connection.connect({ address: stack.temporalAddress });
    try {
      const tenant = await createTenant(watching.store, 5);
      const r = await createWith(`${base}/stopped`, tenant.inferenceKey, watching);
      expect(r.status, JSON.stringify(r.body)).to.equal(202);
      await until('two failed attempts', () => (rx.received.filter((x) => x.path === '/stopped').length >= 2 ? true : undefined));
      expect((await call(`${watching.url}/api/v1/batches/${r.body.id}`, { key: tenant.inferenceKey })).body).to.include({
        status: 'completed',
        webhook: null,
      });
      await new Client({ connection }).workflow.getHandle(r.body.id).terminate('an operator');
      const b = await until('the delivery recorded', async () => {
        const got = (await call(`${watching.url}/api/v1/batches/${r.body.id}`, { key: tenant.inferenceKey })).body;
        return got.webhook ? got : undefined;
      });
      expect(b.status).to.equal('completed');
      expect(b.webhook).to.deep.include({
        status: 'failed',
        last_status: null,
        last_error: 'the delivery was stopped in Temporal before a receiver took it',
      });
      // The attempts its run made: those received, and one the stop may have cut before it was sent.
      const sent = rx.received.filter((x) => x.path === '/stopped').length;
      expect(b.webhook.attempts).to.be.within(Math.max(sent, 2), sent + 1);
    } finally {
      await connection.close();
      await watching.stop();
    }
  });

  it('does not follow redirects: a 3xx is a failed attempt', async () => {
    const r = await createWith(`${base}/moved`);
    const b = await settled(r.body.id);
    expect(b.webhook).to.deep.include({ status: 'failed', last_status: 302 });
    expect(rx.received.filter((x) => x.headers['webhook-id'] === `msg_${r.body.id}`).every((x) => x.path === '/moved')).to.equal(true);
  });

  it('rotating the secret signs later deliveries with the new one; only management keys see it', async () => {
    expect((await call(`${gw.url}/api/v1/webhooks/secret`, { key: t.inferenceKey })).status).to.equal(403);
    const rotated = await call(`${gw.url}/api/v1/webhooks/secret/rotate`, { method: 'POST', key: t.managementKey });
    expect(rotated.status).to.equal(200);
    const fresh = rotated.body.data.secret;
    expect(fresh).to.not.equal(secret);
    const r = await createWith(`${base}/after-rotation`);
    await settled(r.body.id);
    const [got] = rx.received.filter((x) => x.path === '/after-rotation');
    expect(verify(fresh, got)).to.equal(true);
    expect(verify(secret, got)).to.equal(false);
    secret = fresh;
  });

  it('refuses at create, with a 400, URLs that are not https or that reach private, loopback or link-local addresses', async () => {
    const strict = await startTestGateway({ withWorker: false });
    try {
      const other = await createTenant(strict.store, 5);
      for (const url of [
        'http://example.com/hook',
        'https://127.0.0.1/hook',
        'https://localhost/hook',
        'https://10.1.2.3/hook',
        'https://192.168.0.10/hook',
        'https://169.254.169.254/latest/meta-data',
        'https://[::1]/hook',
        'https://[::ffff:127.0.0.1]/hook',
        // IPv6 forms that carry a loopback IPv4 address: compatible, NAT64, SIIT, 6to4.
        'https://[::127.0.0.1]/',
        'https://[::7f00:1]/',
        'https://[64:ff9b::127.0.0.1]/',
        'https://[::ffff:0:127.0.0.1]/',
        'https://[2002:7f00:1::]/',
        'https://user:pw@example.com/hook',
        'ftp://example.com/hook',
        'not a url',
      ]) {
        const r = await createWith(url, other.inferenceKey, strict);
        expect(r.status, `${url}: ${JSON.stringify(r.body)}`).to.equal(400);
        expect(r.body.error.message).to.match(/^callback_url: /);
      }
      expect(await strict.store.db.collection('batches').countDocuments({ workspace_id: other.workspaceId })).to.equal(0);
    } finally {
      await strict.stop();
    }
  });

  it('a batch without a callback sends nothing', async () => {
    const before = rx.received.length;
    const r = await call(`${gw.url}/api/v1/batches`, {
      key: t.inferenceKey,
      body: { endpoint: '/v1/embeddings', model: 'sandbox/embed-1', requests: lines },
    });
    const b = await waitForStatus(gw.url, t.inferenceKey, r.body.id, ['completed']);
    expect(b.callback_url).to.equal(null);
    expect(b.webhook).to.equal(null);
    expect(rx.received.length).to.equal(before);
  });

  it("receivers that never answer hold no slot of the batch worker: another workspace's batch runs meanwhile", async () => {
    // A receiver that takes every connection and answers none.
    const open = new Set<net.Socket>();
    let closed = 0;
    const hole = net.createServer((socket) => {
      open.add(socket);
      socket.on('error', () => undefined).on('close', () => (open.delete(socket), closed++));
    });
    await new Promise<void>((r) => hole.listen(0, '127.0.0.1', r));
    const holeUrl = `http://127.0.0.1:${(hole.address() as AddressInfo).port}/hook`;
    // 105 batches of one workspace within a minute: past its create limit.
    const slow = await startTestGateway({
      env: { WEBHOOKS_ALLOW_PRIVATE_URLS: 'true', WEBHOOK_TIMEOUT_MS: '60000', BATCH_CREATES_PER_MINUTE: '1000' },
    });
    try {
      const hog = await createTenant(slow.store, 5);
      const other = await createTenant(slow.store, 5);
      // More deliveries than a worker has activity slots (the SDK's 100).
      let next = 0;
      await Promise.all(
        Array.from({ length: 10 }, async () => {
          while (next++ < 105) expect((await createWith(holeUrl, hog.inferenceKey, slow)).status).to.equal(202);
        }),
      );
      await until('100 deliveries waiting on the receiver', () => (open.size >= 100 ? true : undefined), 60_000);
      const r = await call(`${slow.url}/api/v1/batches`, {
        key: other.inferenceKey,
        body: { endpoint: '/v1/embeddings', model: 'sandbox/embed-1', requests: lines },
      });
      await waitForStatus(slow.url, other.inferenceKey, r.body.id, ['completed'], 30_000);
      expect(closed, 'no delivery gave up meanwhile: every slot they take stayed taken').to.equal(0);
      expect(open.size).to.be.at.least(100);
    } finally {
      // The receiver stops listening first: a delivery retried meanwhile would otherwise reach it and
      // wait out its 60 s timeout, holding the worker's stop (seen under load: the test timed out).
      const holeClosed = new Promise((r) => hole.close(r));
      for (const s of open) s.destroy(); // the deliveries fail at once, and the worker can stop
      await slow.stop();
      await holeClosed;
    }
  });
});
