// A hot route's answer leaves before the middleware chain unwinds, with what the layers set on the
// way in, and the layers on the way out still see its status. Exercised over a real socket.
import type { AddressInfo } from 'node:net';
import Koa from 'koa';
import { expect } from 'chai';
import { sendJson } from '../../api/send-json';

const UNWIND_MS = 400;

describe('sendJson', () => {
  it('answers before the outer layers return, with their headers, its own type and length; they see status 200', async () => {
    const seenByOuter: number[] = [];
    let unwound = 0;
    const app = new Koa();
    app.use(async (ctx, next) => {
      ctx.set('x-outer', 'set on the way in');
      await next();
      await new Promise((r) => setTimeout(r, UNWIND_MS)); // a slow layer on the way out
      seenByOuter.push(ctx.status);
      unwound = performance.now();
    });
    app.use((ctx) => sendJson(ctx, { answer: 'é', n: 1 }));
    const server = app.listen(0, '127.0.0.1');
    await new Promise((r) => server.once('listening', r));
    try {
      const res = await fetch(`http://127.0.0.1:${(server.address() as AddressInfo).port}/`);
      const text = await res.text();
      const answered = performance.now();
      expect(res.status).to.equal(200);
      expect(res.headers.get('x-outer')).to.equal('set on the way in');
      expect(res.headers.get('content-type')).to.equal('application/json; charset=utf-8');
      expect(res.headers.get('content-length')).to.equal(String(Buffer.byteLength(text)));
      expect(JSON.parse(text)).to.deep.equal({ answer: 'é', n: 1 });
      await new Promise((r) => setTimeout(r, UNWIND_MS + 100));
      expect(seenByOuter).to.deep.equal([200]);
      // The client had the whole answer before the outer layer returned (with Koa's own respond, after).
      expect(unwound).to.be.above(answered);
    } finally {
      server.close();
    }
  });
});
