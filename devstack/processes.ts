// Child processes the gateway starts itself (Temporal dev server, FerretDB, sandbox, worker):
// started under a watchdog (devstack/watchdog) that kills them if we die, waited on until they
// answer, and stopped with SIGTERM then SIGKILL.
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';

class ProcessStartError extends Error {}

/** An error with its cause: fetch's own message ("fetch failed") does not say whether the port was closed or the connection reset. */
function describe(err: unknown): string {
  const cause = err instanceof Error ? (err.cause as { code?: string; message?: string } | undefined) : undefined;
  return cause ? `${String(err)} (${cause.code ?? cause.message})` : String(err);
}

export class ManagedProcess {
  private readonly output: string[] = [];
  private exited: { code: number | null; signal: NodeJS.Signals | null } | null = null;
  private readonly exitPromise: Promise<void>;
  /** The command's own pid (the watchdog's child), once it is running. */
  private commandPid: number | undefined;

  constructor(
    readonly name: string,
    readonly child: ChildProcess,
  ) {
    const keep = (b: Buffer) => {
      for (const line of b.toString().split('\n')) {
        if (!line) continue;
        this.output.push(line);
        if (this.output.length > 40) this.output.shift();
      }
    };
    child.on('message', (m: { pid?: number }) => {
      if (typeof m?.pid === 'number') this.commandPid = m.pid;
    });
    child.stdout?.on('data', keep);
    child.stderr?.on('data', keep);
    this.exitPromise = new Promise((resolve) => {
      child.once('exit', (code, signal) => {
        this.exited = { code, signal };
        resolve();
      });
    });
    live.add(this);
    void this.exitPromise.then(() => live.delete(this));
  }

  /** The command's pid (not its watchdog's), for measuring and signalling it. */
  get pid(): number | undefined {
    return this.commandPid ?? this.child.pid;
  }

  /** How it exited, once it has: an exit code or the signal that ended it. */
  get exitStatus(): { code: number | null; signal: NodeJS.Signals | null } | null {
    return this.exited;
  }

  get hasExited(): boolean {
    return this.exited !== null;
  }

  /** Resolves when the process exits, however it ends. */
  get done(): Promise<void> {
    return this.exitPromise;
  }

  recentOutput(): string {
    return this.output.join('\n');
  }

  /** Polls `check` until it succeeds; fails early, with the process's output, if the process dies. */
  async waitUntil(check: () => Promise<unknown>, timeoutMs: number, what: string): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    let lastError: unknown;
    while (Date.now() < deadline) {
      if (this.exited) {
        throw new ProcessStartError(
          `${this.name} exited (code ${this.exited.code}, signal ${this.exited.signal}) before ${what}:\n${this.recentOutput()}`,
        );
      }
      try {
        await check();
        return;
      } catch (err) {
        lastError = err;
      }
      await new Promise((r) => setTimeout(r, 200));
    }
    throw new ProcessStartError(
      `${this.name} did not become ready (${what}) within ${timeoutMs} ms: ${describe(lastError)}\n${this.recentOutput()}`,
    );
  }

  async stop(graceMs = 5_000): Promise<void> {
    if (this.exited) return;
    this.child.kill('SIGTERM');
    const timer = setTimeout(() => this.child.kill('SIGKILL'), graceMs);
    await this.exitPromise;
    clearTimeout(timer);
  }

  /** Sudden death of the command, as a crash would be (its watchdog reports it): used by fault tests. */
  async kill(): Promise<void> {
    if (this.exited) return;
    this.killNow();
    await this.exitPromise;
  }

  /** SIGKILL to the command itself (its watchdog then reports the death), or to the watchdog before the command runs. */
  killNow(): void {
    try {
      if (this.commandPid) process.kill(this.commandPid, 'SIGKILL');
      else this.child.kill('SIGKILL');
    } catch {
      // already gone
    }
  }
}

const live = new Set<ManagedProcess>();

// Whatever way this process leaves, it takes its children with it.
process.once('exit', () => {
  // The commands themselves: a watchdog killed first could not take its command with it.
  for (const p of live) p.killNow();
});

const WATCHDOG = path.join(__dirname, 'watchdog.js');

export function startProcess(name: string, command: string, args: string[], env: NodeJS.ProcessEnv = process.env): ManagedProcess {
  // The IPC channel is what the watchdog watches: it closes when this process dies, however it dies.
  // A process group of its own: a signal to ours (Ctrl-C, a service manager's SIGTERM) reaches only
  // the gateway, which stops its children itself, after the API processes' last writes to them (a
  // FerretDB stopped first made each of those writes wait out the driver's server selection).
  const child = spawn(process.execPath, [WATCHDOG, command, ...args], { env, stdio: ['ignore', 'pipe', 'pipe', 'ipc'], detached: true });
  child.channel?.unref(); // the channel alone must not keep us running
  const managed = new ManagedProcess(name, child);
  child.once('error', () => {
    /* reported through exit and waitUntil */
  });
  return managed;
}

/**
 * A TCP port that was free a moment ago on loopback, below the kernel's ephemeral range: a port the
 * kernel hands out (bind to 0) is one it also gives outgoing connections, and with a test run's
 * connections one took a port between this answer and its server's bind (Temporal's Web UI: "address
 * already in use"). Falls back to the kernel's choice where the range is unknown.
 */
export async function freePort(host = '127.0.0.1'): Promise<number> {
  const low = ephemeralLow();
  for (let attempt = 0; low !== null && attempt < 50; attempt++) {
    const port = FIRST_PORT + Math.floor(Math.random() * (low - FIRST_PORT));
    if (!handedOut.has(port) && (await bindable(port, host)) !== null) return handOut(port);
  }
  return handOut((await bindable(0, host))!);
}

/**
 * Ports already answered: a port is free until its server binds it, so two calls a moment apart
 * (a gateway's PORT and SANDBOX_PORT) could otherwise both get it, and one server fail to bind.
 */
const handedOut = new Set<number>();

function handOut(port: number): number {
  handedOut.add(port);
  return port;
}

/** Ports handed out from here up to the ephemeral range. */
const FIRST_PORT = 10_000;

/** The first port of the kernel's ephemeral range, when it leaves room below it (Linux). */
function ephemeralLow(): number | null {
  try {
    const low = Number(fs.readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]);
    return Number.isInteger(low) && low > FIRST_PORT + 1_000 ? low : null;
  } catch {
    return null;
  }
}

/** The port, once bound and released on `host` (0: the kernel's choice); null when in use. */
function bindable(port: number, host: string): Promise<number | null> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', (err: NodeJS.ErrnoException) =>
      port !== 0 && (err.code === 'EADDRINUSE' || err.code === 'EACCES') ? resolve(null) : reject(err),
    );
    srv.listen(port, host, () => {
      const bound = (srv.address() as net.AddressInfo).port;
      srv.close(() => resolve(bound));
    });
  });
}

export function tcpReachable(host: string, port: number, timeoutMs = 1_000): Promise<void> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host, port });
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error(`timeout connecting to ${host}:${port}`));
    }, timeoutMs);
    socket.once('connect', () => {
      clearTimeout(timer);
      socket.end();
      resolve();
    });
    socket.once('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
  });
}
