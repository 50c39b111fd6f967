// The floor of a Node gateway, for the proxy bench: a forwarder that does nothing but pass each
// POST to the sandbox provider and its answer back (no auth, limits, routing, validation or
// billing), on the same HTTP client the gateway uses. FLOOR_KIND=node is a bare `node:http`
// server; FLOOR_KIND=koa is Koa with @koa/router (the gateway's fixed stack) and the body parsed
// and serialised once each way, as any gateway that reads the request and the answer must. What
// these add over calling the provider directly is what any Node gateway on this machine adds at least.
import http from 'node:http';
import Koa from 'koa';
import Router from '@koa/router';
import { Agent, request } from 'undici';

const upstream = process.env.FLOOR_UPSTREAM!;
const agent = new Agent({ keepAliveTimeout: 30_000, connections: 512 });

async function forward(path: string, body: string | Buffer, accept: string | undefined) {
  return request(`${upstream}${path}`, {
    method: 'POST',
    body,
    headers: { 'content-type': 'application/json', accept: accept ?? 'application/json' },
    dispatcher: agent,
  });
}

async function readAll(req: http.IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}

function nodeServer(): http.Server {
  return http.createServer((req, res) => {
    void (async () => {
      const r = await forward(req.url!, await readAll(req), req.headers.accept);
      res.writeHead(r.statusCode, { 'content-type': String(r.headers['content-type'] ?? 'application/json') });
      for await (const chunk of r.body) res.write(chunk);
      res.end();
    })().catch(() => res.destroy());
  });
}

function koaServer(): http.Server {
  const app = new Koa();
  const router = new Router();
  router.post(/.*/, async (ctx) => {
    const body = JSON.parse((await readAll(ctx.req)).toString('utf8'));
    const r = await forward(ctx.path, JSON.stringify(body), ctx.get('accept') || undefined);
    ctx.status = r.statusCode;
    ctx.type = String(r.headers['content-type'] ?? 'application/json');
    // A stream is passed through as it arrives; a whole answer is parsed and serialised again.
    ctx.body = ctx.type.includes('event-stream') ? r.body : JSON.stringify(JSON.parse(await r.body.text()));
  });
  app.use(router.routes());
  return http.createServer(app.callback());
}

const server = process.env.FLOOR_KIND === 'koa' ? koaServer() : nodeServer();
server.keepAliveTimeout = 60_000;
server.listen(Number(process.env.PORT), '127.0.0.1');
