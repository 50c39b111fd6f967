// The sandbox provider: a real HTTP server of ours that model providers' clients can talk to
// offline. It answers health checks here; the provider wire formats arrive with the catalog.
import http from 'node:http';
import type { AddressInfo } from 'node:net';

function send(res: http.ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

export function createSandboxServer(): http.Server {
  return http.createServer((req, res) => {
    if (req.method === 'GET' && req.url === '/healthz') return send(res, 200, { status: 'ok', provider: 'sandbox' });
    send(res, 404, { error: { message: `sandbox: no route for ${req.method} ${req.url}`, type: 'not_found' } });
  });
}

export async function listenSandbox(host: string, port: number): Promise<{ url: string; close(): Promise<void> }> {
  const server = createSandboxServer();
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve());
  });
  const { port: bound } = server.address() as AddressInfo;
  return {
    url: `http://${host}:${bound}`,
    close: () => new Promise((resolve) => { server.close(() => resolve()); server.closeAllConnections(); }),
  };
}
