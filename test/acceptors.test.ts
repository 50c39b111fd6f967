import { expect } from 'chai';
import http from 'node:http';
import net from 'node:net';
import { Acceptors, socketOptions } from '../api/acceptors';
import { startTestGateway } from './helpers';
import { capturingLogger } from './capture-log';
import { until } from './until';

/** A server whose requests each keep the loop busy for 5 ms, as a loaded gateway's do. */
async function listening(): Promise<{ server: http.Server; port: number }> {
  const server = http.createServer((req, res) => {
    const until = performance.now() + 5;
    while (performance.now() < until);
    res.end('ok');
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { server, port: (server.address() as net.AddressInfo).port };
}

/** An answer to one request on a fresh connection (HTTP/1.1, closed after). */
function get(socket: net.Socket): Promise<string> {
  return new Promise((resolve, reject) => {
    let text = '';
    socket.on('data', (d) => (text += d));
    socket.on('end', () => resolve(text));
    socket.on('error', reject);
    socket.write('GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
  });
}

/**
 * Opens `n` connections while this process's event loop is held for 200 ms (busy), so that all of
 * them wait in the socket's accept queue together, then counts how many the server accepts in each
 * loop turn. `send` runs on each connection once it is open.
 */
async function burstWhileBusy<T>(
  server: http.Server,
  port: number,
  n: number,
  send: (s: net.Socket) => Promise<T>,
): Promise<{ perTurn: number[]; results: T[] }> {
  const perTurn: number[] = [];
  let turn = 0;
  let counting = true;
  const count = () => (perTurn[turn] = (perTurn[turn] ?? 0) + 1);
  server.on('connection', count);
  const sockets = Array.from({ length: n }, () => net.connect(port, '127.0.0.1'));
  await new Promise<void>((resolve) =>
    // After the connects' own ticks (net.connect issues connect(2) on the next tick).
    process.nextTick(() => {
      const until = Date.now() + 200;
      while (Date.now() < until); // the kernel completes the handshakes meanwhile
      const tick = () => {
        turn++;
        if (counting) setImmediate(tick);
      };
      setImmediate(tick);
      resolve();
    }),
  );
  const results = await Promise.all(sockets.map(send));
  counting = false;
  server.off('connection', count);
  return { perTurn: perTurn.filter((c) => c !== undefined), results };
}

describe('acceptors: more descriptors of the listening socket while busy', () => {
  it('a busy process accepts a burst of new connections up to HTTP_ACCEPTORS per loop turn (Node alone: one), each served', async () => {
    const { logger } = capturingLogger();
    for (const count of [4, 1]) {
      const { server, port } = await listening();
      const acceptors = await Acceptors.start(server, { count, logger });
      expect(acceptors.spare).to.equal(count - 1);
      expect(acceptors.active).to.equal(0);
      const { perTurn, results } = await burstWhileBusy(server, port, 12, get);
      expect(
        perTurn.reduce((a, b) => a + b),
        `per turn: ${perTurn}`,
      ).to.equal(12);
      // The first turn sees the busy loop on the one descriptor; the next ones accept on all.
      expect(Math.max(...perTurn), `per turn: ${perTurn}`).to.equal(count);
      expect(acceptors.active).to.equal(count - 1);
      for (const r of results) expect(r).to.match(/^HTTP\/1\.1 200 OK\r\n[\s\S]*\r\n\r\nok$/);
      await acceptors.close();
      server.close();
    }
  });

  it('a process at rest accepts on its one descriptor (several API processes then share a burst); it narrows after a spell at rest and fetches new spares', async () => {
    const { server, port } = await listening();
    const acceptors = await Acceptors.start(server, { count: 4, logger: capturingLogger().logger, idleMs: 300 });
    await new Promise((r) => setTimeout(r, 50));
    // Connections one at a time, the loop idle in between: nothing widens. Idle for 100 ms, not
    // less: with the cores shared (test files in parallel, Temporal, FerretDB), a connection's few
    // ms of work may take tens of ms, and 20 ms gaps once read as a loop busy over half the time.
    for (let i = 0; i < 5; i++) {
      expect(await get(net.connect(port, '127.0.0.1'))).to.match(/^HTTP\/1\.1 200/);
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(acceptors.active).to.equal(0);
    await burstWhileBusy(server, port, 8, get);
    expect(acceptors.active).to.equal(3);
    expect(acceptors.spare).to.equal(0);
    await until('narrowed at rest', () => acceptors.active === 0, 5_000, 10);
    await until('spares fetched again', () => acceptors.spare === 3, 5_000, 10);
    // And the next busy spell widens again.
    const { perTurn } = await burstWhileBusy(server, port, 40, get);
    expect(Math.max(...perTurn), `per turn: ${perTurn}`).to.equal(4);
    await acceptors.close();
    server.close();
  });

  it("gives the connections it accepts the server's own socket options (half-open allowed, no Nagle delay)", async () => {
    const { server, port } = await listening();
    const { highWaterMark, ...flags } = socketOptions(server);
    expect(flags).to.deep.equal({ allowHalfOpen: true, noDelay: true, keepAlive: false, keepAliveInitialDelay: 0 });
    expect(highWaterMark).to.be.a('number').above(0);
    const acceptors = await Acceptors.start(server, { count: 8, logger: capturingLogger().logger });
    acceptors.widen();
    // `_server` is the net.Server that accepted it (http sets `server` to itself on every connection).
    const viaAcceptor: boolean[] = [];
    server.on('connection', (s: net.Socket & { _server?: net.Server }) => {
      if (s._server !== server) viaAcceptor.push(s.allowHalfOpen);
    });
    const { results } = await burstWhileBusy(server, port, 16, get);
    expect(results.every((a) => a.startsWith('HTTP/1.1 200'))).to.equal(true);
    expect(viaAcceptor.length).to.be.at.least(7);
    expect(viaAcceptor.every((h) => h)).to.equal(true);
    await acceptors.close();
    server.close();
  });

  it("puts the server's request timeouts on the connections they accept: a client that never finishes its headers gets a 408", async () => {
    const server = http.createServer({ headersTimeout: 500, requestTimeout: 500, connectionsCheckingInterval: 100 }, (req, res) =>
      res.end('ok'),
    );
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const port = (server.address() as net.AddressInfo).port;
    const acceptors = await Acceptors.start(server, { count: 4, logger: capturingLogger().logger });
    acceptors.widen();
    let viaAcceptor = 0;
    server.on('connection', (s: net.Socket & { _server?: net.Server }) => (viaAcceptor += s._server !== server ? 1 : 0));
    const slow = (s: net.Socket) =>
      new Promise<string>((resolve) => {
        let text = '';
        s.on('data', (d) => (text += d));
        s.on('close', () => resolve(text));
        s.write('GET / HTTP/1.1\r\nHost: x\r\n'); // and nothing more
      });
    const { results } = await burstWhileBusy(server, port, 8, slow);
    expect(viaAcceptor).to.be.at.least(3);
    for (const r of results) expect(r).to.match(/^HTTP\/1\.1 408/);
    await acceptors.close();
    server.close();
  });

  it('closing waits for the connections the extra descriptors accepted, as server.close() does for its own', async () => {
    const { server, port } = await listening();
    const acceptors = await Acceptors.start(server, { count: 4, logger: capturingLogger().logger });
    acceptors.widen();
    // Requests whose bodies never complete hold their connections open.
    const stalled = (s: net.Socket) =>
      new Promise<net.Socket>((resolve) => {
        s.on('error', () => undefined);
        s.write('POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"a', () => resolve(s));
      });
    const { results: sockets } = await burstWhileBusy(server, port, 8, stalled);
    let closed = false;
    const closing = acceptors.close().then(() => (closed = true));
    await new Promise((r) => setTimeout(r, 150));
    expect(closed).to.equal(false);
    for (const s of sockets) s.destroy();
    await closing;
    expect(closed).to.equal(true);
    server.close();
  });

  it('keeps the one descriptor, with a warning, when the helper cannot run', async () => {
    const { logger, lines } = capturingLogger('warn');
    const { server, port } = await listening();
    const acceptors = await Acceptors.start(server, { count: 4, logger, execPath: '/nonexistent/node' });
    expect(acceptors.spare).to.equal(0);
    acceptors.widen();
    expect(acceptors.active).to.equal(0);
    expect(lines.some((l) => l.msg === 'could not add acceptors to the listening socket; accepting with one')).to.equal(true);
    expect(await get(net.connect(port, '127.0.0.1'))).to.match(/^HTTP\/1\.1 200/);
    await acceptors.close();
    server.close();
  });

  it('a stopped gateway accepts nothing: every descriptor, spare or listening, is closed, so a new connection is refused', async () => {
    const gw = await startTestGateway({ withWorker: false, env: { HTTP_ACCEPTORS: '8' } });
    const port = Number(new URL(gw.url).port);
    expect((await fetch(`${gw.url}/healthz`)).status).to.equal(200);
    await gw.stop();
    const err = await new Promise<NodeJS.ErrnoException | null>((resolve) => {
      const s = net.connect(port, '127.0.0.1');
      s.once('connect', () => {
        s.destroy();
        resolve(null);
      });
      s.once('error', resolve);
    });
    expect(err?.code).to.equal('ECONNREFUSED');
  });
});
