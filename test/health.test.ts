import { expect } from 'chai';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { startFerretDB } from '../devstack/services';
import { freePort } from '../devstack/processes';
import { stack } from './fixture';
import { startTestGateway, type TestGateway } from './helpers';
import { Store } from '../infrastructure/store';
import { capturingLogger } from './capture-log';
import { storagesEntered } from './storages-entered';

describe('health, request ids and the error envelope', () => {
  let gw: TestGateway;
  const { logger, lines } = capturingLogger();

  before(async () => {
    gw = await startTestGateway({ withWorker: false, logger });
  });
  after(async () => {
    await gw.stop();
  });

  it('GET /healthz answers 200 while the process is up', async () => {
    const res = await fetch(`${gw.url}/healthz`);
    expect(res.status).to.equal(200);
    expect(await res.json()).to.deep.equal({ status: 'ok' });
  });

  it('GET /readyz answers 200 with MongoDB and Temporal both reachable, and names the decision mode', async () => {
    const res = await fetch(`${gw.url}/readyz`);
    expect(res.status).to.equal(200);
    expect(await res.json()).to.deep.equal({ status: 'ok', checks: { mongodb: 'ok', temporal: 'ok' }, decisions_execution: 'inline' });
  });

  it("GET /readyz's Temporal ping runs in no AsyncLocalStorage (the first would turn on promise hooks for every request after it)", async () => {
    const entered = await storagesEntered(async () => {
      for (let i = 0; i < 3; i++) expect((await fetch(`${gw.url}/readyz`)).status).to.equal(200);
    });
    expect(entered.length).to.equal(0);
  });

  it('GET /readyz probes arriving together share one check: an unauthenticated flood does not reach MongoDB and Temporal once each', async () => {
    let pings = 0;
    const ping = Store.prototype.ping;
    Store.prototype.ping = function (this: Store, ...args: Parameters<typeof ping>) {
      pings++;
      return ping.apply(this, args);
    };
    try {
      const answers = await Promise.all(Array.from({ length: 50 }, () => fetch(`${gw.url}/readyz`)));
      expect(answers.map((r) => r.status)).to.deep.equal(answers.map(() => 200));
      for (const r of answers) expect(((await r.json()) as any).checks).to.deep.equal({ mongodb: 'ok', temporal: 'ok' });
      // 50 probes sent at once arrive over a few turns of the event loop: a few checks, not 50.
      expect(pings).to.be.within(1, 10);
      // A probe after they are answered runs a check of its own.
      const before = pings;
      expect((await fetch(`${gw.url}/readyz`)).status).to.equal(200);
      expect(pings).to.equal(before + 1);
    } finally {
      Store.prototype.ping = ping;
    }
  });

  it('generates a request id, echoes it, and puts it on the request log line', async () => {
    const res = await fetch(`${gw.url}/healthz`);
    const id = res.headers.get('x-request-id');
    expect(id).to.match(/^[0-9a-f-]{36}$/);
    const line = lines.find((l) => l.request_id === id);
    expect(line).to.include({ msg: 'request', path: '/healthz', status: 200, method: 'GET' });
  });

  it("keeps a caller's sane x-request-id and replaces an unsafe one", async () => {
    const kept = await fetch(`${gw.url}/healthz`, { headers: { 'x-request-id': 'trace-abc.123' } });
    expect(kept.headers.get('x-request-id')).to.equal('trace-abc.123');
    const replaced = await fetch(`${gw.url}/healthz`, { headers: { 'x-request-id': 'bad id with spaces' } });
    expect(replaced.headers.get('x-request-id')).to.match(/^[0-9a-f-]{36}$/);
  });

  it('answers unknown routes with 404 in the error envelope', async () => {
    const res = await fetch(`${gw.url}/nope`);
    expect(res.status).to.equal(404);
    expect(await res.json()).to.deep.equal({ error: { code: 404, message: 'No route for GET /nope', metadata: null }, user_id: null });
  });

  it('answers a wrong method with 405 in the error envelope', async () => {
    const res = await fetch(`${gw.url}/healthz`, { method: 'DELETE' });
    expect(res.status).to.equal(405);
    const body: any = await res.json();
    expect(body.error.code).to.equal(405);
    expect(body.error.message).to.be.a('string');
  });
});

describe('GET /readyz when MongoDB goes away', () => {
  it('turns 503 within a second, naming MongoDB, and 200 again once it is back', async () => {
    // A FerretDB of this test's own, so stopping it leaves the shared one alone.
    const dataDir = path.join(stack.tmpDir, `ferret-readyz-${Date.now()}`);
    const port = await freePort();
    let ferret = await startFerretDB({ binary: stack.tools!.ferretdb, port, dataDir });
    const gw = await startTestGateway({ withWorker: false, mongoUri: ferret.address });
    try {
      expect((await fetch(`${gw.url}/readyz`)).status).to.equal(200);
      await ferret.process.kill();
      const started = Date.now();
      const res = await fetch(`${gw.url}/readyz`);
      expect(res.status).to.equal(503);
      expect(Date.now() - started, 'readyz answers within a second').to.be.lessThan(1000);
      const body: any = await res.json();
      expect(body.error.code).to.equal(503);
      expect(body.error.message).to.match(/^Not ready: mongodb: /);
      expect(body.error.metadata).to.deep.equal({ mongodb: 'unavailable', temporal: 'ok' });
      // Back on the same port and data: ready again without restarting the gateway.
      ferret = await startFerretDB({ binary: stack.tools!.ferretdb, port, dataDir });
      const deadline = Date.now() + 20_000;
      let status = 0;
      while (Date.now() < deadline && (status = (await fetch(`${gw.url}/readyz`)).status) !== 200)
        await new Promise((r) => setTimeout(r, 200));
      expect(status).to.equal(200);
    } finally {
      await ferret.process.stop();
      await gw.stop().catch(() => undefined);
      fs.rmSync(dataDir, { recursive: true, force: true });
    }
  });
});

describe('shutdown', () => {
  it('lets requests in flight finish for SHUTDOWN_GRACE_MS, then closes them rather than waiting on a stalled client', async () => {
    const { logger, lines } = capturingLogger('warn');
    const gw = await startTestGateway({ withWorker: false, logger, env: { SHUTDOWN_GRACE_MS: '300' } });
    // A request whose body never completes holds its connection open.
    const socket = net.connect(Number(new URL(gw.url).port), '127.0.0.1');
    await new Promise((r) => socket.once('connect', r));
    socket.on('error', () => undefined);
    socket.write('POST /api/v1/keys HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"na');
    await new Promise((r) => setTimeout(r, 100));
    const started = Date.now();
    await gw.stop();
    const took = Date.now() - started;
    expect(took, `stop took ${took} ms`).to.be.at.least(250).and.below(5000);
    expect(lines.some((l) => l.msg === 'requests still in flight at the end of the shutdown grace; closing them')).to.equal(true);
    socket.destroy();
  });
});
