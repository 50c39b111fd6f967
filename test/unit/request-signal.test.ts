// The signal a request's work listens on: one per connection for calls without a deadline, one of
// their own (joined to the connection's) for calls with one. Exercised over real sockets.
import http from 'node:http';
import { getEventListeners } from 'node:events';
import type { AddressInfo } from 'node:net';
import type Koa from 'koa';
import { expect } from 'chai';
import { requestSignal } from '../../api/request-signal';

type Seen = { signal: AbortSignal; timedOut: () => boolean; done: () => void; socket: unknown };

/** A server handing each request's signal to the test, answering only when told. */
async function server(timeoutMs: number | null) {
  const seen: Seen[] = [];
  const answer: (() => void)[] = [];
  const s = http.createServer((req, res) => {
    const r = requestSignal({ req, res } as unknown as Koa.ParameterizedContext, timeoutMs);
    seen.push({ ...r, socket: req.socket });
    answer.push(() => {
      r.done();
      res.end('ok');
    });
  });
  await new Promise<void>((resolve) => s.listen(0, '127.0.0.1', resolve));
  return { seen, answer, url: `http://127.0.0.1:${(s.address() as AddressInfo).port}/`, close: () => s.close() };
}

/** Runs `test` against a server and a keep-alive agent of one connection, closing both after. */
async function withServer(timeoutMs: number | null, test: (srv: Awaited<ReturnType<typeof server>>, agent: http.Agent) => Promise<void>) {
  const srv = await server(timeoutMs);
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  try {
    await test(srv, agent);
  } finally {
    agent.destroy();
    srv.close();
  }
}

const wait = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** Reads a request's answer to its end. */
async function answered(req: http.ClientRequest): Promise<void> {
  const res = await new Promise<http.IncomingMessage>((r) => req.on('response', r));
  res.resume();
  await new Promise((r) => res.on('end', r));
}
async function until(what: () => boolean) {
  for (let i = 0; i < 200 && !what(); i++) await wait(5);
  expect(what()).to.equal(true);
}

describe('request signal', () => {
  it('requests on one keep-alive connection share its signal, which fires when the connection closes and not before', () =>
    withServer(null, async (srv, agent) => {
      for (let i = 0; i < 2; i++) {
        const req = http.get(srv.url, { agent });
        await until(() => srv.seen.length === i + 1);
        srv.answer[i]();
        await answered(req);
      }
      expect(srv.seen[1].socket).to.equal(srv.seen[0].socket);
      expect(srv.seen[1].signal).to.equal(srv.seen[0].signal);
      const req = http.get(srv.url, { agent }).on('error', () => undefined);
      await until(() => srv.seen.length === 3);
      expect(srv.seen[2].signal.aborted, 'aborted while the client is there').to.equal(false);
      req.destroy();
      await until(() => srv.seen[2].signal.aborted);
    }));

  it('a request with a deadline gets its own signal: it fires at the deadline, or when the connection closes', () =>
    withServer(100, async (srv, agent) => {
      const first = http.get(srv.url, { agent });
      await until(() => srv.seen.length === 1);
      await until(() => srv.seen[0].signal.aborted);
      expect(srv.seen[0].timedOut()).to.equal(true);
      srv.answer[0]();
      await answered(first);

      const second = http.get(srv.url, { agent }).on('error', () => undefined);
      await until(() => srv.seen.length === 2);
      expect(srv.seen[1].signal).to.not.equal(srv.seen[0].signal);
      expect(srv.seen[1].socket, 'the same connection').to.equal(srv.seen[0].socket);
      second.destroy();
      await until(() => srv.seen[1].signal.aborted);
      expect(srv.seen[1].timedOut()).to.equal(false);
    }));

  it('a request with a deadline that is answered takes its listener off the connection', () =>
    withServer(10_000, async (srv, agent) => {
      // The connection's signal, reached the way a request without a deadline gets it.
      const connectionSignal = () =>
        requestSignal({ req: { socket: srv.seen[0].socket } } as unknown as Koa.ParameterizedContext, null).signal;
      for (let i = 0; i < 3; i++) {
        const req = http.get(srv.url, { agent });
        await until(() => srv.seen.length === i + 1);
        expect(getEventListeners(connectionSignal(), 'abort')).to.have.length(1);
        srv.answer[i]();
        await answered(req);
        expect(getEventListeners(connectionSignal(), 'abort')).to.have.length(0);
        expect(srv.seen[i].signal.aborted).to.equal(false);
      }
    }));
});
