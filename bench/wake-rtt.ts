// What waking a process costs on this machine: the round trip of one byte to an echo process over
// loopback TCP, back to back and after a rest. On the 2-core VMs the bench runs on, a round trip
// to a process that has been asleep for 50 ms or more took 0.5-0.9 ms against 0.15 ms back to back,
// in plain Node with no gateway code, and the same cost appears at every hop of a request that
// finds its process asleep: the first calls of a round after a rest and a stream started after
// a pause pay it. The results carry it so their c=1 and TTFT figures can be read against it.
import { spawn } from 'node:child_process';
import net from 'node:net';
import { sleep } from '../infrastructure/concurrency/sleep';
import { percentiles } from './harness';

const ECHO = `require('net').createServer((s) => { s.setNoDelay(true); s.on('data', (d) => s.write(d)); })
  .listen(0, '127.0.0.1', function () { process.send(this.address().port); });`;

const BACK_TO_BACK = 400;
/** The first back-to-back round trips, not counted: the two processes' own warm-up. */
const UNCOUNTED = 100;
const AFTER_REST = 20;
const REST_MS = 200;

/** Median round trips (ms): back to back, and each after REST_MS with both processes idle. */
export async function wakeRoundTrip(): Promise<{ back_to_back_ms: number; after_rest_ms: number; rest_ms: number }> {
  const child = spawn(process.execPath, ['-e', ECHO], { stdio: ['ignore', 'ignore', 'ignore', 'ipc'] });
  try {
    const port = await new Promise<number>((resolve, reject) => {
      child.once('message', (m) => resolve(Number(m)));
      child.once('exit', (code) => reject(new Error(`echo process exited (${code})`)));
    });
    const socket = net.connect(port, '127.0.0.1');
    socket.setNoDelay(true);
    await new Promise<void>((resolve, reject) => socket.once('connect', resolve).once('error', reject));
    const once = () =>
      new Promise<number>((resolve) => {
        const t0 = performance.now();
        socket.once('data', () => resolve(performance.now() - t0));
        socket.write('x');
      });
    const hot: number[] = [];
    for (let i = 0; i < BACK_TO_BACK; i++) hot.push(await once());
    const rested: number[] = [];
    for (let i = 0; i < AFTER_REST; i++) {
      await sleep(REST_MS);
      rested.push(await once());
    }
    socket.destroy();
    return { back_to_back_ms: percentiles(hot.slice(UNCOUNTED)).p50_ms, after_rest_ms: percentiles(rested).p50_ms, rest_ms: REST_MS };
  } finally {
    child.kill();
  }
}
