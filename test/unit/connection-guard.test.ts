// The connection guard over a real HTTP server: past its limit a new connection takes the place of
// the one idle longest, and is refused only when every connection has a request in progress.
import { expect } from 'chai';
import http from 'node:http';
import net from 'node:net';
import type { AddressInfo } from 'node:net';
import { ConnectionGuard } from '../../api/connection-guard';

const until = async (cond: () => boolean) => {
  for (let i = 0; i < 200 && !cond(); i++) await new Promise((r) => setTimeout(r, 10));
  expect(cond()).to.equal(true);
};

describe('connection guard', () => {
  let server: http.Server;
  let guard: ConnectionGuard;
  let port: number;
  const shed: string[] = [];
  let release: () => void = () => undefined;
  let held = new Promise<void>((r) => (release = r));

  beforeEach(async () => {
    shed.length = 0;
    held = new Promise<void>((r) => (release = r));
    server = http.createServer(async (req, res) => {
      if (req.url === '/slow') await held;
      res.end('ok');
    });
    guard = new ConnectionGuard(server, 3, (how) => shed.push(how));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    port = (server.address() as AddressInfo).port;
  });
  afterEach(async () => {
    release();
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  });

  const open = async () => {
    const s = net.connect(port, '127.0.0.1');
    const state = { socket: s, closed: false, data: '' };
    s.on('close', () => (state.closed = true));
    s.on('error', () => undefined);
    s.on('data', (d) => (state.data += String(d)));
    await new Promise((r) => s.once('connect', r));
    return state;
  };
  const ask = (c: { socket: net.Socket }, path: string) => c.socket.write(`GET ${path} HTTP/1.1\r\nHost: x\r\n\r\n`);

  it('makes room by closing the connection idle longest; one that sent a request since is idle from then', async () => {
    const [a, b, c] = [await open(), await open(), await open()];
    await until(() => guard.size === 3);
    // a asks and is answered: it is now the last to have been active, so b is the one idle longest.
    ask(a, '/');
    await until(() => a.data.includes('200 OK'));
    const d = await open();
    await until(() => b.closed);
    expect([a.closed, c.closed, d.closed]).to.deep.equal([false, false, false]);
    expect(shed).to.deep.equal(['evicted']);
    ask(d, '/');
    await until(() => d.data.includes('200 OK'));
    // A connection still sending its headers counts as idle too.
    c.socket.write('GET / HTTP/1.1\r\nHo');
    await open();
    await until(() => c.closed);
    expect(guard.size).to.equal(3);
  });

  it('never cuts a request in progress: with every connection busy, the new one is refused', async () => {
    const busy = [await open(), await open(), await open()];
    for (const c of busy) ask(c, '/slow');
    await new Promise((r) => setTimeout(r, 50));
    const late = await open();
    await until(() => late.closed);
    expect(shed).to.deep.equal(['refused']);
    expect(guard.size).to.equal(3);
    release();
    for (const c of busy) await until(() => c.data.includes('200 OK'));
    expect(busy.map((c) => c.closed)).to.deep.equal([false, false, false]);
    // Answered, they are idle again and give way to the next new connection.
    const next = await open();
    await until(() => busy[0].closed);
    ask(next, '/');
    await until(() => next.data.includes('200 OK'));
    expect(shed).to.deep.equal(['refused', 'evicted']);
  });
});
