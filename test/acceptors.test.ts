import { expect } from 'chai';
import http from 'node:http';
import net from 'node:net';
import { addAcceptors, socketOptions } from '../api/acceptors';
import { capturingLogger, startTestGateway } from './helpers';

async function listening(): Promise<{ server: http.Server; port: number }> {
  const server = http.createServer((req, res) => res.end('ok'));
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
 * Opens `n` connections while this process's event loop is held, so that all of them wait in the
 * socket's accept queue together, then counts how many the server accepts in each loop turn.
 */
async function acceptedPerTurn(server: http.Server, port: number, n: number): Promise<{ perTurn: number[]; answers: string[] }> {
  const perTurn: number[] = [];
  let turn = 0;
  let counting = true;
  server.on('connection', () => (perTurn[turn] = (perTurn[turn] ?? 0) + 1));
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
  const answers = await Promise.all(sockets.map(get));
  counting = false;
  return { perTurn: perTurn.filter((c) => c !== undefined), answers };
}

describe('acceptors: several descriptors of the listening socket', () => {
  it('accepts a burst of new connections up to HTTP_ACCEPTORS per event-loop turn (Node alone: one per turn), each served by the server', async () => {
    const { logger } = capturingLogger();
    for (const count of [4, 1]) {
      const { server, port } = await listening();
      const acceptors = await addAcceptors(server, count, logger);
      expect(acceptors).to.have.length(count - 1);
      const { perTurn, answers } = await acceptedPerTurn(server, port, 12);
      expect(
        perTurn.reduce((a, b) => a + b),
        `per turn: ${perTurn}`,
      ).to.equal(12);
      expect(Math.max(...perTurn), `per turn: ${perTurn}`).to.equal(count);
      for (const a of answers) expect(a).to.match(/^HTTP\/1\.1 200 OK\r\n[\s\S]*\r\n\r\nok$/);
      for (const a of acceptors) a.close();
      server.close();
    }
  });

  it("gives the connections it accepts the server's own socket options (half-open allowed, no Nagle delay)", async () => {
    const { server, port } = await listening();
    const { highWaterMark, ...flags } = socketOptions(server);
    expect(flags).to.deep.equal({ allowHalfOpen: true, noDelay: true, keepAlive: false, keepAliveInitialDelay: 0 });
    expect(highWaterMark).to.be.a('number').above(0);
    const acceptors = await addAcceptors(server, 8, capturingLogger().logger);
    const seen: boolean[] = [];
    server.on('connection', (s: net.Socket) => seen.push(s.allowHalfOpen));
    const { answers } = await acceptedPerTurn(server, port, 16);
    expect(answers.every((a) => a.startsWith('HTTP/1.1 200'))).to.equal(true);
    expect(seen).to.have.length(16);
    expect(seen.every((h) => h)).to.equal(true);
    for (const a of acceptors) a.close();
    server.close();
  });

  it('keeps the one descriptor, with a warning, when the helper cannot run', async () => {
    const { logger, lines } = capturingLogger('warn');
    const { server, port } = await listening();
    const acceptors = await addAcceptors(server, 4, logger, '/nonexistent/node');
    expect(acceptors).to.have.length(0);
    expect(lines.some((l) => l.msg === 'could not add acceptors to the listening socket; accepting with one')).to.equal(true);
    expect(await get(net.connect(port, '127.0.0.1'))).to.match(/^HTTP\/1\.1 200/);
    server.close();
  });

  it('a stopped gateway accepts nothing: every descriptor is closed, so a new connection is refused', async () => {
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
