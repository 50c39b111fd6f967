// Extra listening descriptors of the API server's socket, so that one process accepts up to that
// many new connections per event-loop turn (nginx's `multi_accept`, in spirit).
//
// Why: since libuv 1.45 (Node 20 has 1.46) a listening handle accepts one connection per loop
// turn. Under load a turn takes 20-80 ms (it runs every request whose bytes arrived meanwhile), so
// a burst of 200 new connections waited up to 1.3 s for its last accept (docs/performance.md). Each
// descriptor is watched on its own, so N descriptors of one socket accept up to N per turn.
//
// Node cannot dup(2) a descriptor, but a handle sent over an IPC channel arrives as a new one: a
// short-lived helper process receives the socket's handle and sends it back N - 1 times. The helper
// never listens on it (a raw handle, not a server), so it cannot take a connection.
//
// The cost: with connections arriving one at a time, every descriptor is woken for each and all but
// one find nothing to accept, ~3 µs each (HTTP_ACCEPTORS=1 turns this off; keep-alive clients pay
// nothing).
import { spawn } from 'node:child_process';
import type http from 'node:http';
import net from 'node:net';
import type { Logger } from '../infrastructure/log';

/** How long the helper may take before the server goes on with its one descriptor. */
const HELPER_TIMEOUT_MS = 10_000;

/** The helper: sends each handle it receives back `n` times, then leaves once they are taken. */
const ECHO = `process.on('message', (m, handle) => {
  for (let i = 0; i < m.n; i++) process.send('handle', handle);
  process.send('done', () => process.disconnect());
});`;

/**
 * Starts `count - 1` more acceptors on `server`'s listening socket; their connections are served by
 * `server` as its own. Returns them, to be closed with it. Never fails: without the helper, the
 * server keeps its one descriptor (logged). `execPath` runs the helper: Node itself.
 */
export async function addAcceptors(server: http.Server, count: number, logger: Logger, execPath = process.execPath): Promise<net.Server[]> {
  const handle = (server as unknown as { _handle?: unknown })._handle;
  if (count <= 1 || !handle || process.platform === 'win32') return [];
  const acceptors: net.Server[] = [];
  try {
    await new Promise<void>((resolve, reject) => {
      // Not fork(): the gateway's own flags (a --cpu-prof, say) are not the helper's.
      const helper = spawn(execPath, ['-e', ECHO], {
        stdio: ['ignore', 'ignore', 'inherit', 'ipc'],
        env: { ...process.env, NODE_OPTIONS: '' },
      });
      const timer = setTimeout(() => {
        helper.kill();
        reject(new Error(`no answer within ${HELPER_TIMEOUT_MS} ms`));
      }, HELPER_TIMEOUT_MS);
      helper.once('error', (err) => {
        clearTimeout(timer);
        reject(err);
      });
      helper.once('exit', (code) => {
        clearTimeout(timer);
        // After 'done' this settles nothing; before it, the helper died.
        reject(new Error(`helper exited (code ${code}) before sending the handles`));
      });
      helper.on('message', (message, copy) => {
        if (message === 'done') {
          clearTimeout(timer);
          resolve();
          return;
        }
        acceptors.push(acceptor(server, copy as net.Server, logger));
      });
      helper.send({ n: count - 1 }, handle as net.Server);
    });
  } catch (err) {
    for (const a of acceptors.splice(0)) a.close();
    logger.warn({ err: (err as Error).message }, 'could not add acceptors to the listening socket; accepting with one');
  }
  return acceptors;
}

/** A server on one more descriptor of the socket, handing each connection to `server` as its own. */
function acceptor(server: http.Server, handle: net.Server, logger: Logger): net.Server {
  const a = net.createServer(socketOptions(server));
  a.on('connection', (socket) => server.emit('connection', socket));
  // accept(2) failing (EMFILE) is the server's condition, not a reason to stop the process.
  a.on('error', (err) => logger.warn({ err: err.message }, 'an acceptor failed to accept a connection'));
  a.listen(handle);
  return a;
}

/**
 * The options `server` gives the sockets it accepts (http.Server sets allowHalfOpen and noDelay),
 * as net.Server keeps them on itself: Node's types do not declare these fields.
 */
export function socketOptions(server: net.Server): net.ServerOpts {
  const { allowHalfOpen, noDelay, keepAlive, keepAliveInitialDelay, highWaterMark } = server as unknown as Required<net.ServerOpts>;
  return { allowHalfOpen, noDelay, keepAlive, keepAliveInitialDelay, highWaterMark };
}
