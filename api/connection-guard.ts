// At most `limit` client connections per API process, so that a client holding connections open
// leaves the process the descriptors its own work needs. Found by probing: 19,500 silent sockets
// took all 20,000 of the process's descriptors, and the usage journal, the database and the
// providers could not open one; every workspace's calls failed until the sockets left.
//
// Past the limit a new connection takes the place of the one idle longest: no request in progress
// (it never sent one, is still sending its headers, or waits between keep-alive requests), which
// costs its owner a reconnect at most. A request in progress is never cut: when every connection
// has one, the new connection is closed instead. So a flood of idle sockets cannot keep new
// clients out, and one of busy sockets needs a key (unauthenticated requests are answered before
// their bodies are read) and meets the per-workspace limits.
import type http from 'node:http';
import type net from 'node:net';

export class ConnectionGuard {
  /** Connections without a request in progress, the one idle longest first. */
  private readonly idle = new Set<net.Socket>();
  /** Connections with requests in progress, and how many (pipelined requests queue on one). */
  private readonly busy = new Map<net.Socket, number>();

  constructor(
    server: http.Server,
    private readonly limit: number,
    /** Told of each connection closed to make room (`evicted`) or refused because none could be. */
    private readonly onShed: (how: 'evicted' | 'refused') => void = () => undefined,
  ) {
    server.on('connection', this.onConnection);
    server.on('request', this.onRequest);
  }

  /** Client connections open now. */
  get size(): number {
    return this.idle.size + this.busy.size;
  }

  private readonly onConnection = (socket: net.Socket): void => {
    if (this.size >= this.limit) {
      const oldest = this.idle.values().next();
      if (oldest.done) {
        socket.destroy();
        this.onShed('refused');
        return;
      }
      this.idle.delete(oldest.value);
      oldest.value.destroy();
      this.onShed('evicted');
    }
    this.idle.add(socket);
    socket.once('close', () => {
      this.idle.delete(socket);
      this.busy.delete(socket);
    });
  };

  private readonly onRequest = (req: http.IncomingMessage, res: http.ServerResponse): void => {
    const socket = req.socket;
    if (!this.idle.delete(socket) && !this.busy.has(socket)) return; // closed meanwhile
    this.busy.set(socket, (this.busy.get(socket) ?? 0) + 1);
    res.once('close', () => {
      const left = (this.busy.get(socket) ?? 0) - 1;
      if (left > 0) this.busy.set(socket, left);
      else if (this.busy.delete(socket) && !socket.destroyed) this.idle.add(socket); // idle from now: last in line
    });
  };
}
