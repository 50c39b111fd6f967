// A route's JSON answer leaves before the middleware chain unwinds, with what the layers set on the
// way in, and the layers on the way out still see its status; what is not JSON is left to Koa.
// Exercised over a real socket.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { Readable } from 'node:stream';
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
    app.use((ctx) => {
      ctx.body = { answer: 'é', n: 1 };
      sendJson(ctx);
    });
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

  it("keeps the handler's status, and leaves HEAD, text and streams to Koa", async () => {
    const app = new Koa();
    app.use((ctx) => {
      if (ctx.path === '/created') {
        ctx.status = 201;
        ctx.body = [{ id: 'x' }];
      } else if (ctx.path === '/text') ctx.body = 'plain';
      else if (ctx.path === '/stream') ctx.body = Readable.from(['a', 'b']);
      else ctx.body = { head: true };
      sendJson(ctx);
      if (ctx.path !== '/created' && ctx.respond === false) throw new Error(`${ctx.method} ${ctx.path} was written as JSON`);
    });
    const server = app.listen(0, '127.0.0.1');
    await new Promise((r) => server.once('listening', r));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    try {
      const created = await fetch(`${url}/created`);
      expect(created.status).to.equal(201);
      expect(await created.json()).to.deep.equal([{ id: 'x' }]);
      const text = await fetch(`${url}/text`);
      expect(text.headers.get('content-type')).to.match(/^text\/plain/);
      expect(await text.text()).to.equal('plain');
      expect(await (await fetch(`${url}/stream`)).text()).to.equal('ab');
      const head = await fetch(`${url}/head`, { method: 'HEAD' });
      expect(head.status).to.equal(200);
      expect(await head.text()).to.equal('');
    } finally {
      server.close();
    }
  });

  it("writes a body with a long array in pieces: the same text and length as JSON.stringify, to a client reading slowly; a failure to serialise is the handler's error", async function () {
    this.timeout(30_000);
    const big = {
      object: 'list',
      data: Array.from({ length: 3_000 }, (_, i) => ({ i, v: Array.from({ length: 100 }, (_, j) => i / (j + 1)) })),
      n: 1,
    };
    const app = new Koa();
    app.silent = true;
    app.use(async (ctx) => {
      ctx.body = ctx.path === '/bad' ? { data: Array.from({ length: 100 }, (_, i) => (i === 99 ? { n: BigInt(1) } : i)) } : big;
      const sent = sendJson(ctx);
      expect(sent).to.be.instanceOf(Promise);
      await sent;
    });
    const server = app.listen(0, '127.0.0.1');
    await new Promise((r) => server.once('listening', r));
    const port = (server.address() as AddressInfo).port;
    try {
      const want = JSON.stringify(big);
      expect(want.length).to.be.above(4 * 1024 * 1024); // several pieces
      // Read slowly: the socket fills, and the writer waits for it to drain.
      const got = await new Promise<{ length: string; text: string }>((resolve, reject) => {
        http
          .get(`http://127.0.0.1:${port}/`, (res) => {
            const chunks: Buffer[] = [];
            res.on('data', (c: Buffer) => {
              chunks.push(c);
              res.pause();
              setTimeout(() => res.resume(), 1);
            });
            res.on('end', () => resolve({ length: res.headers['content-length']!, text: Buffer.concat(chunks).toString('utf8') }));
          })
          .on('error', reject);
      });
      expect(got.length).to.equal(String(Buffer.byteLength(want)));
      expect(got.text === want, 'the text JSON.stringify writes').to.equal(true);
      expect((await fetch(`http://127.0.0.1:${port}/bad`)).status).to.equal(500);
    } finally {
      server.close();
    }
  });
});
