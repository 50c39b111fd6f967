// Binds the Koa app to a port and closes it cleanly.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { Acceptors } from './acceptors';
import { ConnectionGuard } from './connection-guard';
import { createApp } from './app';
import { envelope } from './errors';
import { errorFromStatus } from '../infrastructure/errors';
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
  const guard = new ConnectionGuard(server, deps.config.http.maxConnections, (how) => deps.metrics.connectionsShed.inc({ how }));
  deps.metrics.watchConnections(() => guard.size);
  // Requests Node refuses before Koa sees them (headers or URL over 16 KB, malformed HTTP) still get
  // an answer in the error envelope, not a bare status line.
  server.on('clientError', (err: NodeJS.ErrnoException, socket) => {
    if (err.code === 'ECONNRESET' || !socket.writable) {
      socket.destroy();
      return;
    }
    const [status, reason, message] =
      err.code === 'HPE_HEADER_OVERFLOW'
        ? [431, 'Request Header Fields Too Large', 'Request line and headers are larger than 16 KB (a long URL or header)']
        : err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
          ? [408, 'Request Timeout', 'Request was not received in time']
          : [400, 'Bad Request', 'Malformed HTTP request'];
    const body = JSON.stringify(envelope(errorFromStatus(status, message)));
    socket.end(
      `HTTP/1.1 ${status} ${reason}\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
    );
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve());
  });
  const acceptors = await Acceptors.start(server, { count: deps.config.http.acceptors, logger: deps.logger });
  const addr = server.address() as AddressInfo;
  return {
    url: `http://${host}:${addr.port}`,
    server,
    // Stops accepting, lets requests in flight finish for SHUTDOWN_GRACE_MS, then cuts what is left.
    close: async () => {
      const cut = setTimeout(() => {
        deps.logger.warn(
          { grace_ms: deps.config.http.shutdownGraceMs },
          'requests still in flight at the end of the shutdown grace; closing them',
        );
        server.closeAllConnections();
      }, deps.config.http.shutdownGraceMs);
      const closed = [new Promise<void>((resolve) => server.close(() => resolve())), acceptors.close()];
      server.closeIdleConnections();
      await Promise.all(closed);
      clearTimeout(cut);
    },
  };
}
