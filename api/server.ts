// Binds the Koa app to a port and closes it cleanly.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { createApp } from './app';
import type { AppDeps } from './deps';

export interface ApiServer {
  url: string;
  server: http.Server;
  close(): Promise<void>;
}

export async function startApiServer(deps: AppDeps, host: string, port: number): Promise<ApiServer> {
  const app = createApp(deps);
  const server = http.createServer(app.callback());
  server.keepAliveTimeout = 65_000; // longer than common load balancers' idle timeouts
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve());
  });
  const addr = server.address() as AddressInfo;
  return {
    url: `http://${host}:${addr.port}`,
    server,
    close: () => new Promise<void>((resolve) => {
      server.close(() => resolve());
      server.closeIdleConnections();
    }),
  };
}
