// What becomes of a request body that was not read, once its answer is decided.
//
// Node drops it as it arrives, so that a kept-alive connection can carry the next request, but
// without a bound: one unauthenticated connection sending an endless chunked body was read at
// 800 MB/s, and took the API process's whole core for as long as it went on. So it is dropped here,
// counted, and past LINGER_BYTES the connection is closed.
//
// A refusal in the middle of a body ends the connection instead (`Connection: close`), and Node
// closes the socket as soon as the answer is written. Closing a socket with unread bytes makes the
// kernel send a reset, and a client still sending its body then loses the answer: Python's urllib
// (which reads only once it has sent everything) got "Broken pipe" instead of a 413 on 20 tries of
// 20, fetch on 4 of 20, and a test client lost a 429 under load. So, as nginx's `lingering_close`
// does, the answer is followed by the end of our side of the connection, and what the client still
// sends is dropped until it stops (the end of its body, or its close), for at most LINGER_MS; then
// the socket is closed.
import type http from 'node:http';

const LINGER_MS = 5_000;
const LINGER_BYTES = 64 * 1024 ** 2;

const dropping = new WeakSet<http.IncomingMessage>();

/**
 * Drops what arrives of `req`'s body from now on: past LINGER_BYTES, the connection is closed. If
 * its answer is the connection's last (`Connection: close`, ours or the client's), the socket is
 * closed once the body ends, the client closes, or LINGER_MS pass, whichever is first.
 */
export function dropUnread(req: http.IncomingMessage): void {
  if (req.complete || dropping.has(req)) return; // what is left has arrived: Node drops it
  dropping.add(req);
  let dropped = 0;
  req.on('data', (chunk: Buffer) => {
    dropped += chunk.length;
    if (dropped > LINGER_BYTES) req.socket.destroy();
  });
  req.resume();
  // Node ends a connection's last answer with this (http's resOnFinish): the end of our side, then the close.
  const socket = req.socket as http.IncomingMessage['socket'] & { destroySoon(): void };
  const closeSoon = socket.destroySoon.bind(socket);
  socket.destroySoon = () => {
    if (req.complete) return closeSoon(); // nothing left unread
    socket.end();
    const close = () => {
      clearTimeout(timer);
      socket.destroy();
    };
    const timer = setTimeout(close, LINGER_MS).unref();
    socket.once('close', () => clearTimeout(timer));
    req.once('end', close).once('error', close);
  };
}
