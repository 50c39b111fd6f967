import { expect } from 'chai';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { ensureTools, ToolBuildError } from '../devstack/binaries';
import { freePort, startProcess } from '../devstack/processes';
import { stack } from './fixture';
import { allApiProcessesUp, call, waitForStatus, writeTestCatalog } from './helpers';
import { endpointEntry, modelEntry, providerEntry } from '../domain/catalog/entries';
import { until } from './until';

const root = path.resolve(__dirname, '..', '..');
const bin = path.join(root, 'bin', 'gateway.js');

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** Environment for a `gateway start` of its own: the embedded stack on free ports, data in `dataDir`. */
async function embeddedStackEnv(dataDir: string): Promise<NodeJS.ProcessEnv> {
  return {
    ...process.env,
    PORT: String(await freePort()),
    TEMPORAL_PORT: String(await freePort()),
    TEMPORAL_UI_PORT: String(await freePort()),
    FERRETDB_PORT: String(await freePort()),
    SANDBOX_PORT: String(await freePort()),
    DATA_DIR: dataDir,
    LOG_LEVEL: 'info',
    // Two API processes sharing PORT, whatever the machine's cores: the cluster is what `start` runs.
    API_PROCESSES: '2',
    MONGODB_URI: '',
    TEMPORAL_ADDRESS: '',
  };
}

/** Environment for a `gateway start` on the fixture's database and Temporal (`name` keeps its data apart): only the sandbox is started. */
async function externalServicesEnv(name: string): Promise<NodeJS.ProcessEnv> {
  const at = Date.now();
  return {
    ...process.env,
    PORT: String(await freePort()),
    SANDBOX_PORT: String(await freePort()),
    LOG_LEVEL: 'info',
    MONGODB_URI: stack.mongoUri,
    MONGODB_DATABASE: `${name.replace(/-/g, '_')}_${at}`,
    TEMPORAL_ADDRESS: stack.temporalAddress,
    TEMPORAL_TASK_QUEUE: `${name}-${at}`,
    TOOLS_DIR: '/nonexistent-tools',
    DATA_DIR: path.join(stack.tmpDir, `${name}-${at}`),
    API_PROCESSES: '1',
  };
}

/** Every process of the machine, with its parent and command line (read from /proc). */
function allProcesses(): { pid: number; ppid: number; cmd: string }[] {
  return fs
    .readdirSync('/proc')
    .filter((d) => /^\d+$/.test(d))
    .flatMap((d) => {
      try {
        const stat = fs.readFileSync(`/proc/${d}/stat`, 'utf8');
        const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
        return [{ pid: Number(d), ppid, cmd: fs.readFileSync(`/proc/${d}/cmdline`, 'utf8').replace(/\0/g, ' ') }];
      } catch {
        return []; // gone meanwhile
      }
    });
}

/** Every process below `pid`, with its command line. */
function descendants(pid: number): { pid: number; cmd: string }[] {
  const all = allProcesses();
  const out: { pid: number; cmd: string }[] = [];
  const walk = (p: number) => {
    for (const c of all.filter((x) => x.ppid === p)) {
      out.push(c);
      walk(c.pid);
    }
  };
  walk(pid);
  return out;
}

/** The process group a process is in (the fifth field of /proc/<pid>/stat, after the parenthesised name). */
function processGroup(pid: number): number {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[2]);
}

/**
 * Kills every process started with this DATA_DIR (a test that failed midway leaves its gateway
 * running): the gateway and its API processes by their environment, the embedded services by
 * their command lines.
 */
function killEverythingOf(dataDir: string): void {
  for (const d of fs.readdirSync('/proc').filter((x) => /^\d+$/.test(x))) {
    try {
      const env = fs.readFileSync(`/proc/${d}/environ`, 'utf8').split('\0');
      const cmd = fs.readFileSync(`/proc/${d}/cmdline`, 'utf8');
      if (env.includes(`DATA_DIR=${dataDir}`) || cmd.includes(dataDir)) process.kill(Number(d), 'SIGKILL');
    } catch {
      // gone, or not ours to read
    }
  }
}

/** The supervised command (not its watchdog) whose command line matches. */
function commandPid(gateway: number, match: RegExp): number | undefined {
  return descendants(gateway).find((p) => match.test(p.cmd) && !p.cmd.includes('watchdog.js'))?.pid;
}

/** Runs `gateway start` and resolves once it prints its ready line, with every line it printed. */
async function startUntilReady(
  env: NodeJS.ProcessEnv,
  timeoutMs: number,
  /** In a process group of its own, so that a test can signal the whole group. */
  detached = false,
): Promise<{ child: ReturnType<typeof spawn>; said: string[]; complained: string[] }> {
  const child = spawn(process.execPath, [bin, 'start'], { env, stdio: ['ignore', 'pipe', 'pipe'], detached });
  const said: string[] = [];
  const complained: string[] = [];
  readline.createInterface({ input: child.stderr! }).on('line', (l) => complained.push(l));
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no ready line; saw:\n${said.join('\n')}`)), timeoutMs);
    readline.createInterface({ input: child.stdout! }).on('line', (l) => {
      said.push(l);
      if (l.includes('ready')) {
        clearTimeout(timer);
        resolve();
      }
    });
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`exited ${code}:\n${said.join('\n')}\nstderr:\n${complained.join('\n')}`));
    });
  });
  return { child, said, complained };
}

describe('gateway CLI', () => {
  it('`gateway --help` lists the commands', () => {
    const out = spawnSync(process.execPath, [bin, '--help'], { encoding: 'utf8' });
    expect(out.status).to.equal(0);
    for (const cmd of ['start', 'api', 'worker', 'sandbox', 'tools', 'check'])
      expect(out.stdout).to.match(new RegExp(`^\\s+${cmd}\\b`, 'm'));
  });

  it('refuses an invalid environment variable with a message naming it', () => {
    const out = spawnSync(process.execPath, [bin, 'start'], { encoding: 'utf8', env: { ...process.env, PORT: 'http' } });
    expect(out.status).to.equal(2);
    expect(out.stderr).to.include('PORT');
  });

  it('refuses a DATA_DIR it cannot write, naming it, before starting anything', () => {
    const file = path.join(os.tmpdir(), `not-a-dir-${process.pid}`);
    fs.writeFileSync(file, '');
    try {
      for (const cmd of ['start', 'api']) {
        const out = spawnSync(process.execPath, [bin, cmd], {
          encoding: 'utf8',
          env: { ...process.env, DATA_DIR: path.join(file, 'data') },
          timeout: 20_000,
        });
        expect(out.status, cmd).to.equal(2);
        expect(out.stderr, cmd).to.include(`DATA_DIR (${path.join(file, 'data')}) is not a directory this process can write (ENOTDIR)`);
      }
    } finally {
      fs.rmSync(file);
    }
  });

  it('logs JSON lines when not on a terminal and readable lines with LOG_FORMAT=pretty', async () => {
    const firstLine = async (extra: NodeJS.ProcessEnv) => {
      const child = spawn(process.execPath, [bin, 'sandbox'], {
        env: { ...process.env, SANDBOX_PORT: String(await freePort()), LOG_LEVEL: 'info', LOG_FORMAT: '', ...extra },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      try {
        return await new Promise<string>((resolve) => readline.createInterface({ input: child.stdout! }).once('line', resolve));
      } finally {
        child.kill('SIGTERM');
      }
    };
    const piped = await firstLine({});
    expect(JSON.parse(piped)).to.include({ msg: 'sandbox provider listening' });
    expect(JSON.parse(await firstLine({ LOG_FORMAT: 'json' }))).to.include({ level: 30 });
    const readable = await firstLine({ LOG_FORMAT: 'pretty' });
    expect(readable).to.match(/INFO.*sandbox provider listening/);
    expect(() => JSON.parse(readable)).to.throw();
  });

  it('names the missing Go toolchain and the alternative when a binary must be built', async () => {
    const empty = fs.mkdtempSync(path.join(os.tmpdir(), 'tools-'));
    const savedPath = process.env.PATH;
    process.env.PATH = '/nonexistent';
    try {
      await ensureTools(empty, { temporal: true, ferretdb: false }, () => undefined);
      expect.fail('should throw');
    } catch (err) {
      expect(err).to.be.instanceOf(ToolBuildError);
      expect((err as Error).message)
        .to.include("'go'")
        .and.include('TEMPORAL_ADDRESS');
    } finally {
      process.env.PATH = savedPath;
      fs.rmSync(empty, { recursive: true, force: true });
    }
  });

  it('`gateway start` brings up the embedded stack, reuses its data, and SIGTERM stops every child', async function () {
    this.timeout(120_000);
    const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'gateway-start-'));
    const env = await embeddedStackEnv(dataDir);
    let firstKey = '';
    try {
      for (const round of [1, 2]) {
        const { child, said, complained } = await startUntilReady(env, 90_000);
        // Not a terminal: every line is JSON, progress included.
        for (const line of said) expect(() => JSON.parse(line), line).to.not.throw();
        expect(said.join('\n'))
          .to.include(`Web UI http://127.0.0.1:${env.TEMPORAL_UI_PORT} (loopback only: it has no authentication`)
          .and.include(`sandbox provider on http://127.0.0.1:${env.SANDBOX_PORT}`)
          .and.include(`metrics on http://127.0.0.1:${env.PORT}/metrics (loopback only; set METRICS_TOKEN before exposing it`);
        // The first start on an empty database prints a management key once; later starts do not.
        const printedKey = said.join('\n').match(/sk-gw-v1-[0-9a-f]{64}/)?.[0];
        if (round === 1) {
          expect(printedKey, said.join('\n')).to.be.a('string');
          firstKey = printedKey!;
        } else {
          expect(printedKey).to.equal(undefined);
        }
        const me = await fetch(`http://127.0.0.1:${env.PORT}/api/v1/credits`, { headers: { authorization: `Bearer ${firstKey}` } });
        expect(me.status).to.equal(200);
        const balance = ((await me.json()) as { data: { balance: number } }).data.balance;
        // The welcome credit; in round 2, less the first round's two batch lines.
        if (round === 1) expect(balance).to.equal(10);
        else expect(balance).to.be.below(10).and.above(9.99);
        const ready = await fetch(`http://127.0.0.1:${env.PORT}/readyz`);
        expect(ready.status).to.equal(200);
        // Two API processes share the port: concurrent connections reach both, and a scrape of either sums them.
        expect(said.join('\n')).to.include('2 API processes sharing the port (API_PROCESSES)');
        // /readyz is answered by whichever process is up first: the burst waits for both.
        await allApiProcessesUp(`http://127.0.0.1:${env.PORT}`, 2);
        // Which process accepts a new connection is the kernel's race: one full run saw a burst of 20
        // all taken by one process. Bursts (each on new connections) until both served, at most 10.
        let scrape = '';
        let served = [0, 0];
        for (let burst = 0; burst < 10 && !(served[0] > 0 && served[1] > 0); burst++) {
          await Promise.all(
            Array.from({ length: 20 }, () =>
              fetch(`http://127.0.0.1:${env.PORT}/api/v1/credits`, {
                headers: { authorization: `Bearer ${firstKey}`, connection: 'close' },
              }),
            ),
          );
          scrape = await (await fetch(`http://127.0.0.1:${env.PORT}/metrics`)).text();
          served = [0, 1].map((i) => Number(scrape.match(new RegExp(`gateway_api_process_requests\\{process="${i}"\\} (\\d+)`))?.[1]));
        }
        expect(served[0], scrape.slice(0, 2000)).to.be.above(0);
        expect(served[1]).to.be.above(0);
        expect(served[0] + served[1]).to.be.at.least(21);
        if (round === 1) {
          // Batch lines run on the worker process beside them; its counters are in the same /metrics.
          const batch = await fetch(`http://127.0.0.1:${env.PORT}/api/v1/batches`, {
            method: 'POST',
            headers: { authorization: `Bearer ${firstKey}`, 'content-type': 'application/json' },
            body: JSON.stringify({
              endpoint: '/v1/chat/completions',
              model: 'sandbox/chat-1',
              requests: [1, 2].map((i) => ({
                custom_id: `l${i}`,
                body: { messages: [{ role: 'user', content: `hi ${i}` }], max_tokens: 3 },
              })),
            }),
          });
          expect(batch.status, await batch.clone().text()).to.equal(202);
          await until('the batch lines counted in /metrics', async () => {
            const text = await (await fetch(`http://127.0.0.1:${env.PORT}/metrics`)).text();
            return /gateway_batch_lines_total\{outcome="completed"\} 2\b/.test(text) || undefined;
          });
        }
        const ui = await fetch(`http://127.0.0.1:${env.TEMPORAL_UI_PORT}/`);
        expect(ui.status).to.equal(200);
        // `gateway check` runs a workflow through the started worker and writes to the embedded database.
        const check = spawnSync(process.execPath, [bin, 'check'], {
          encoding: 'utf8',
          env: { ...env, LOG_LEVEL: 'warn', TEMPORAL_ADDRESS: `127.0.0.1:${env.TEMPORAL_PORT}` },
        });
        expect(check.status, check.stderr).to.equal(0);
        expect(JSON.parse(check.stdout)).to.include({ ok: true });
        const children = descendants(child.pid!).map((p) => p.pid);
        expect(children.length).to.be.at.least(6); // temporal, ferretdb, sandbox, each under a watchdog
        if (round === 2) {
          // The workflow history of round 1 survived the restart in DATA_DIR.
          const list = spawnSync(
            stack.tools!.temporal,
            ['workflow', 'list', '--address', `127.0.0.1:${env.TEMPORAL_PORT}`, '--output', 'json'],
            { encoding: 'utf8' },
          );
          expect(JSON.parse(list.stdout)).to.have.length(3); // two checks and round 1's batch
        }
        const exited = new Promise((r) => child.once('exit', r));
        child.kill('SIGTERM');
        if (round === 2) child.kill('SIGTERM'); // an impatient second signal changes nothing
        const code = await exited;
        expect(code).to.equal(0);
        const output = [...said, ...complained].join('\n');
        expect(output).to.include('shutting down').and.not.include('IllegalStateError');
        // Once by the gateway (each API process says it of itself too).
        expect(said.filter((l) => l.includes('shutting down') && JSON.parse(l).name === 'gateway')).to.have.length(1);
        for (const pid of children) expect(alive(pid), `child ${pid} still running`).to.equal(false);
      }
    } finally {
      killEverythingOf(dataDir);
      fs.rmSync(dataDir, { recursive: true, force: true });
    }
  });

  it('`gateway start` supervises what it starts: restarts a killed part (readyz names it meanwhile), refuses a held port, dies with its children, gives up on a crash loop', async function () {
    this.timeout(180_000);
    const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'gateway-supervise-'));
    const env = await embeddedStackEnv(dataDir);
    // Each probe on a connection of its own: a kept-alive one may be a killed process's, and a
    // request sent on it before the client reads its close fails (as seen once in CI), whatever the
    // port does. Its status and body, or null when the connection failed.
    const readyz = () =>
      new Promise<{ status: number; body: any } | null>((resolve) => {
        http
          .get(`http://127.0.0.1:${env.PORT}/readyz`, { agent: false }, (res) => {
            let text = '';
            res.setEncoding('utf8').on('data', (c: string) => (text += c));
            res.on('end', () => {
              try {
                resolve({ status: res.statusCode!, body: JSON.parse(text) });
              } catch {
                resolve({ status: res.statusCode!, body: text });
              }
            });
          })
          .on('error', () => resolve(null));
      });
    try {
      let { child } = await startUntilReady(env, 90_000);
      const gateway = child.pid!;
      // Asked the moment the gateway says ready, both processes name the embedded services (each
      // had them from its start, not from a message that could arrive after the first request).
      for (const r of await Promise.all(Array.from({ length: 8 }, readyz)))
        expect(r)
          .to.deep.include({ status: 200 })
          .and.nested.property('body.embedded')
          .deep.equal({ ferretdb: 'ok', temporal: 'ok', sandbox: 'ok' });

      // The sandbox dies: /readyz names it within a second and turns 200 again once it is back.
      process.kill(commandPid(gateway, /index\.js sandbox/)!, 'SIGKILL');
      const down = await until(
        'readyz 503',
        async () => {
          const r = await readyz();
          return r?.status === 503 ? r : undefined;
        },
        2_000,
      );
      expect(down.body.error.message).to.include('sandbox: restarting');
      expect(down.body.error.metadata.embedded.sandbox).to.equal('restarting');
      await until('sandbox back', async () => (await readyz())?.status === 200);

      // An API process dies: the other keeps answering on the port, and another takes its place.
      const apiPids = () =>
        descendants(gateway)
          .filter((p) => /index\.js api\s*$/.test(p.cmd))
          .map((p) => p.pid);
      expect(apiPids()).to.have.length(2);
      const [victim] = apiPids();
      process.kill(victim, 'SIGKILL');
      await new Promise((r) => setTimeout(r, 200)); // the kill has landed
      // New connections are what the survivor must take.
      for (let i = 0; i < 20; i++) expect(await readyz(), 'the other process answers').to.deep.include({ status: 200 });
      await until('a new API process', () => {
        const pids = apiPids();
        return pids.length === 2 && !pids.includes(victim) ? pids : undefined;
      });
      await allApiProcessesUp(`http://127.0.0.1:${env.PORT}`, 2);
      // The Temporal worker runs beside them in a process of its own, and is replaced the same way.
      const workerPid = () => descendants(gateway).find((p) => /index\.js worker\s*$/.test(p.cmd))?.pid;
      const worker = workerPid();
      expect(worker, 'a worker process').to.be.a('number');
      process.kill(worker!, 'SIGKILL');
      await until('a new worker process', () => {
        const pid = workerPid();
        return pid && pid !== worker ? pid : undefined;
      });

      // FerretDB dies: restarted on the same port and data; the API reconnects by itself.
      process.kill(commandPid(gateway, /ferretdb/)!, 'SIGKILL');
      await until('FerretDB back', async () => (await readyz())?.status === 200 && (await readyz())?.body.embedded.ferretdb === 'ok');
      expect((await fetch(`http://127.0.0.1:${env.PORT}/api/v1/models`)).status).to.equal(401); // answering, and asking for a key

      // A second start on the same data while this one runs is refused, naming it; on other data, naming the port.
      const second = spawnSync(process.execPath, [bin, 'start'], { env, encoding: 'utf8', timeout: 30_000 });
      expect(second.status).to.equal(1);
      expect(second.stderr).to.include(`another gateway (pid ${gateway}) is running with this DATA_DIR`);
      const otherData = fs.mkdtempSync(path.join(os.tmpdir(), 'gateway-other-'));
      const third = spawnSync(process.execPath, [bin, 'start'], {
        env: { ...env, DATA_DIR: otherData },
        encoding: 'utf8',
        timeout: 30_000,
      });
      fs.rmSync(otherData, { recursive: true, force: true });
      expect(third.status).to.equal(1);
      expect(third.stderr).to.match(/port \d+ \((FERRETDB_PORT|TEMPORAL_PORT|TEMPORAL_UI_PORT|SANDBOX_PORT|PORT)\) is already in use/);

      // kill -9 of the gateway: every process it started goes with it.
      const family = descendants(gateway).map((p) => p.pid);
      expect(family.length).to.be.at.least(6); // three watchdogs and their commands
      process.kill(gateway, 'SIGKILL');
      await until('children gone', () => family.every((p) => !alive(p)) || undefined, 10_000);

      // Started again on the same data; then a sandbox that keeps crashing stops everything, non-zero.
      ({ child } = await startUntilReady(env, 90_000));
      const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
      let output = '';
      child.stdout!.on('data', (b) => {
        output += b;
      });
      let kills = 0;
      const killer = setInterval(() => {
        const pid = commandPid(child.pid!, /index\.js sandbox/);
        if (pid && alive(pid)) {
          process.kill(pid, 'SIGKILL');
          kills++;
        }
      }, 50);
      const code = await exited.finally(() => clearInterval(killer));
      expect(code).to.equal(1);
      expect(kills).to.be.at.least(5);
      expect(output).to.match(/sandbox exited 5 times within 60 s/);
    } finally {
      killEverythingOf(dataDir);
      fs.rmSync(dataDir, { recursive: true, force: true });
    }
  });

  it('`gateway start` first stops what a killed earlier run left holding its ports; SIGTERM to the process group restarts nothing', async function () {
    this.timeout(120_000);
    const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'gateway-leftover-'));
    const env = await embeddedStackEnv(dataDir);
    // An earlier run whose gateway is gone but whose FerretDB still holds the port (as for a moment after a SIGKILL).
    const dead = spawnSync(process.execPath, ['-e', 'process.pid']).pid;
    const marker = `leftover-ferretdb-${path.basename(dataDir)}`;
    const leftover = spawn(
      process.execPath,
      ['-e', `require('net').createServer().listen(${env.FERRETDB_PORT}, '127.0.0.1', () => console.log('listening'))`, marker],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    await new Promise((r) => leftover.stdout!.once('data', r));
    fs.writeFileSync(
      path.join(dataDir, 'run.json'),
      JSON.stringify({ pid: dead, children: { ferretdb: { pid: leftover.pid, command: marker } } }),
    );
    try {
      const { child, said } = await startUntilReady(env, 90_000, true);
      expect(said.join('\n')).to.include(`stopped what an earlier run left running: ferretdb (pid ${leftover.pid})`);
      expect(alive(leftover.pid!)).to.equal(false);
      // Ready within seconds: a fresh start's first checks may take longer than /readyz waits for
      // them (800 ms) while the suite loads the machine (a CI run saw a 503 right after "ready").
      await until('ready', async () => ((await fetch(`http://127.0.0.1:${env.PORT}/readyz`)).status === 200 ? true : undefined), 20_000);

      // SIGTERM to the whole process group, as a service manager or a terminal's Ctrl-C sends it: the
      // gateway and its API processes get it at once; the services do not, so none exits to be restarted.
      const family = descendants(child.pid!).map((p) => p.pid);
      // The embedded services are not in the signalled group: they are stopped by the gateway, after
      // the API processes' last writes (a FerretDB gone first made each of them wait out server selection).
      const services = JSON.parse(fs.readFileSync(path.join(dataDir, 'run.json'), 'utf8')).children as Record<string, { pid: number }>;
      expect(Object.keys(services)).to.have.members(['ferretdb', 'temporal', 'sandbox']);
      for (const [name, { pid }] of Object.entries(services)) expect(processGroup(pid), name).to.not.equal(child.pid);
      const started = Date.now();
      const exited = new Promise((r) => child.once('exit', r));
      let output = '';
      child.stdout!.on('data', (b) => (output += b));
      child.stderr!.on('data', (b) => (output += b));
      process.kill(-child.pid!, 'SIGTERM');
      expect(await exited).to.equal(0);
      expect(output).to.not.include('restarting').and.not.include('is back');
      expect(output).to.not.include('not retired').and.not.include('not put back in the pool');
      expect(Date.now() - started, 'the stop took too long').to.be.below(12_000);
      for (const pid of family) expect(alive(pid), `child ${pid} still running`).to.equal(false);
      expect(fs.existsSync(path.join(dataDir, 'run.json')), 'a clean stop leaves no run record').to.equal(false);
    } finally {
      leftover.kill('SIGKILL');
      killEverythingOf(dataDir);
      fs.rmSync(dataDir, { recursive: true, force: true });
    }
  });

  it('`gateway start` does not restart a FerretDB that dies while the gateway stops, and still stops cleanly', async function () {
    this.timeout(120_000);
    const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'gateway-stop-crash-'));
    const env = await embeddedStackEnv(dataDir);
    try {
      const { child } = await startUntilReady(env, 90_000);
      await until('ready', async () => ((await fetch(`http://127.0.0.1:${env.PORT}/readyz`)).status === 200 ? true : undefined), 20_000);
      const services = JSON.parse(fs.readFileSync(path.join(dataDir, 'run.json'), 'utf8')).children as Record<string, { pid: number }>;
      const family = descendants(child.pid!).map((p) => p.pid);
      let output = '';
      child.stdout!.on('data', (b) => (output += b));
      child.stderr!.on('data', (b) => (output += b));
      const started = Date.now();
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      process.kill(services.ferretdb.pid, 'SIGKILL');
      expect(await exited, output).to.equal(0);
      expect(output).to.include('shutting down').and.not.include('restarting').and.not.include('is back');
      // The same bound as the group-signal test's: the stop does not wait for a restart.
      expect(Date.now() - started, 'the stop took too long').to.be.below(12_000);
      for (const pid of family) expect(alive(pid), `child ${pid} still running`).to.equal(false);
      expect(allProcesses().filter((p) => p.cmd.includes(dataDir))).to.deep.equal([]);
      expect(fs.existsSync(path.join(dataDir, 'run.json')), 'a clean stop leaves no run record').to.equal(false);
    } finally {
      killEverythingOf(dataDir);
      fs.rmSync(dataDir, { recursive: true, force: true });
    }
  });

  it('`gateway start` whose Temporal state is gone (temporal.db removed) gives the open batches of its database new runs: they finish, no finished line run again', async function () {
    this.timeout(180_000);
    const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'gateway-reset-'));
    // One line at a time, 100 ms each: a batch still running when the gateway is stopped.
    const catalog = writeTestCatalog('reset', (c) => {
      c.providers.push(providerEntry('reset-slow', `\${SANDBOX_URL}/~latency=100/openai/v1`, { max_concurrency: 1 }));
      c.models.push(
        modelEntry('test/reset-slow', [endpointEntry('reset-slow', 1, { upstream_model: 'sandbox-chat' })], { context_length: 1000 }),
      );
    });
    const env: NodeJS.ProcessEnv = { ...(await embeddedStackEnv(dataDir)), API_PROCESSES: '1', CATALOG_PATH: catalog };
    const api = `http://127.0.0.1:${env.PORT}/api/v1`;
    const stop = async (child: ReturnType<typeof spawn>) => {
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      expect(await exited).to.equal(0);
    };
    const calls = async () =>
      Object.values((await (await fetch(`http://127.0.0.1:${env.SANDBOX_PORT}/_calls`)).json()) as Record<string, number>).reduce(
        (a, n) => a + n,
        0,
      );
    try {
      const first = await startUntilReady(env, 90_000);
      const key = first.said.join('\n').match(/sk-gw-v1-[0-9a-f]{64}/)![0];
      const created = await call(`${api}/batches`, {
        key,
        body: {
          endpoint: '/v1/chat/completions',
          model: 'test/reset-slow',
          requests: Array.from({ length: 30 }, (_, i) => ({
            custom_id: `l${i}`,
            body: { messages: [{ role: 'user', content: `q${i}` }], max_tokens: 3 },
          })),
        },
      });
      expect(created.status, JSON.stringify(created.body)).to.equal(202);
      const id = created.body.id;
      const doneBefore = await until('a few lines done', async () => {
        const n = (await call(`${api}/batches/${id}`, { key })).body.request_counts.completed;
        return n >= 3 ? n : undefined;
      });
      await stop(first.child);
      for (const f of fs.readdirSync(dataDir).filter((f) => f.startsWith('temporal.db'))) fs.rmSync(path.join(dataDir, f));

      const second = await startUntilReady(env, 90_000);
      try {
        await until('the recovery said', () => second.said.some((l) => l.includes("Temporal's state is new")) || undefined);
        expect(second.said.join('\n')).to.include(
          "Temporal's state is new (namespace default has a new id): 1 open batch(es) from before given a new run",
        );
        const b = await waitForStatus(`http://127.0.0.1:${env.PORT}`, key, id, ['completed', 'failed', 'cancelled', 'expired'], 30_000);
        expect(b.status).to.equal('completed');
        expect(b.request_counts).to.deep.include({ total: 30, completed: 30, failed: 0 });
        expect(new Set(b.results.map((r: any) => r.custom_id)).size).to.equal(30);
        // The new sandbox was called only for lines not done before the stop (and the one in flight then).
        expect(await calls()).to.be.within(1, 30 - doneBefore + 1);
      } finally {
        await stop(second.child);
      }
      // A start whose Temporal kept its state gives nothing a new run.
      const third = await startUntilReady(env, 90_000);
      await until('the ready line', () => third.said.some((l) => l.includes('ready — Ctrl-C')) || undefined);
      await new Promise((r) => setTimeout(r, 500)); // the worker's check of Temporal's state is done by then
      expect(third.said.join('\n')).to.not.include("Temporal's state is new");
      await stop(third.child);
    } finally {
      killEverythingOf(dataDir);
      fs.rmSync(dataDir, { recursive: true, force: true });
    }
  });

  it('`gateway start` uses the services named by MONGODB_URI and TEMPORAL_ADDRESS instead of starting its own', async function () {
    this.timeout(60_000);
    const env = await externalServicesEnv('start-external');
    const { child, said } = await startUntilReady(env, 45_000);
    try {
      expect(said.join('\n')).to.not.include('FerretDB').and.not.include('Temporal dev server');
      expect((await fetch(`http://127.0.0.1:${env.PORT}/readyz`)).status).to.equal(200);
      // Only the sandbox is a child: no tools were needed (TOOLS_DIR does not even exist).
      const children = spawnSync('pgrep', ['-P', String(child.pid)], { encoding: 'utf8' })
        .stdout.trim()
        .split('\n')
        .filter(Boolean);
      expect(children).to.have.length(1);
      // DATA_DIR holds only the API's usage journal and the run record (the sandbox's pid): no FerretDB or Temporal files.
      expect(fs.readdirSync(env.DATA_DIR!).sort()).to.deep.equal(['run.json', 'usage-journal']);
      expect(Object.keys(JSON.parse(fs.readFileSync(path.join(env.DATA_DIR!, 'run.json'), 'utf8')).children)).to.deep.equal(['sandbox']);
    } finally {
      child.kill('SIGTERM');
      await new Promise((r) => child.once('exit', r));
    }
  });

  it('a log reader that stops reading holds neither requests nor the exit; the lines dropped are counted once it reads again', async function () {
    this.timeout(120_000);
    const env: NodeJS.ProcessEnv = {
      ...(await externalServicesEnv('stalled-log')),
      LOG_FORMAT: 'json',
      LOG_BUFFER_BYTES: '64kb',
      // The cluster, whose processes (and their acceptor helpers) share the descriptor.
      API_PROCESSES: '2',
    };
    const port = Number(env.PORT);
    // stdout and stderr one pipe, as under `> log 2>&1` or systemd: a child inheriting stderr once
    // made that shared descriptor blocking, so a full pipe then held every write to stdout.
    const child = spawn('/bin/sh', ['-c', `exec "${process.execPath}" "${bin}" start 2>&1`], { env, stdio: ['ignore', 'pipe', 'ignore'] });
    const lines: string[] = [];
    readline.createInterface({ input: child.stdout! }).on('line', (l) => lines.push(l));
    const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
    const until = async (what: string, test: () => boolean, ms: number) => {
      for (const deadline = Date.now() + ms; !test(); await new Promise((r) => setTimeout(r, 50)))
        if (Date.now() > deadline) throw new Error(`no ${what} within ${ms} ms; saw:\n${lines.slice(-20).join('\n')}`);
    };
    /** `n` requests at c=16, each logged; how many were answered within 10 s each. */
    const requests = async (n: number) => {
      let left = n;
      let answered = 0;
      const loop = async () => {
        while (left-- > 0) {
          const res = await fetch(`http://127.0.0.1:${port}/healthz`, { signal: AbortSignal.timeout(10_000) });
          await res.arrayBuffer();
          if (res.ok) answered++;
        }
      };
      await Promise.all(Array.from({ length: 16 }, loop));
      return answered;
    };
    const dropNotes = () =>
      lines.flatMap((l) => {
        const line = JSON.parse(l) as { msg?: string; dropped_lines?: number };
        return line.msg === 'log lines dropped: stdout was not read' ? [line.dropped_lines!] : [];
      });
    try {
      await until('ready line', () => lines.some((l) => l.includes('ready')), 60_000);
      child.stdout!.pause(); // the pipe fills: 64 KB, then each process's 64 KB
      expect(await requests(4000)).to.equal(4000);
      expect(dropNotes()).to.deep.equal([]);
      child.stdout!.resume();
      await until('note of the lines dropped', () => dropNotes().length > 0, 20_000);
      expect(dropNotes().every((n) => n > 0)).to.equal(true);
      // And counted where an operator alerts on it, whose log may be what nobody reads.
      const scrape = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
      // (at least what the notes read so far say: another process's note may still be on its way)
      const counted = Number(/^gateway_log_lines_dropped_total (\d+)/m.exec(scrape)?.[1]);
      expect(counted).to.be.at.least(dropNotes().reduce((a, b) => a + b, 0));
      // Every line read is whole JSON (a line is written whole or dropped whole).
      for (const l of lines) expect(() => JSON.parse(l), l).to.not.throw();
      child.stdout!.pause();
      expect(await requests(4000)).to.equal(4000);
      child.kill('SIGTERM');
      const code = await Promise.race([exited, new Promise((r) => setTimeout(() => r('still running after 30 s'), 30_000))]);
      expect(code).to.equal(0);
    } finally {
      child.stdout!.resume();
      child.kill('SIGKILL');
      killEverythingOf(env.DATA_DIR!);
    }
  });

  it('a managed process dies with its owner, whether the owner exits or is killed', async () => {
    const processes = path.join(root, 'dist', 'devstack', 'processes.js');
    for (const [how, seconds] of [
      ['exits', '3601.5'],
      ['is killed', '3602.5'],
    ] as const) {
      // An owner that calls process.exit a moment after starting the command (its exit handler runs),
      // or one killed with SIGKILL (nothing of it runs; its watchdog sees the IPC channel close).
      const exitLater = how === 'exits' ? 'setTimeout(() => process.exit(0), 1000);' : '';
      const owner = spawn(process.execPath, [
        '-e',
        `require(${JSON.stringify(processes)}).startProcess('sleeper', 'sleep', ['${seconds}']); setInterval(() => {}, 1000); ${exitLater}`,
      ]);
      const sleeper = await until(
        'the command running',
        () => descendants(owner.pid!).find((p) => p.cmd.startsWith(`sleep ${seconds}`))?.pid,
      );
      if (how === 'is killed') owner.kill('SIGKILL');
      await until(`the command gone after its owner ${how}`, () => !alive(sleeper) || undefined, 5_000);
    }
  });

  it('a managed process dies with its owner when the owner is gone before its watchdog reports the command (a CI run left it running)', async () => {
    // The owner's end of the channel closed before the watchdog has even started: its report of the
    // command's pid then fails. That failure was an unhandled error that killed the watchdog alone.
    const seconds = '3603.5';
    const watchdog = spawn(process.execPath, [path.join(root, 'dist', 'devstack', 'watchdog.js'), 'sleep', seconds], {
      stdio: ['ignore', 'pipe', 'pipe', 'ipc'],
    });
    watchdog.disconnect();
    let stderr = '';
    watchdog.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    const exit = await new Promise<{ code: number | null; signal: string | null }>((resolve) =>
      watchdog.once('exit', (code, signal) => resolve({ code, signal })),
    );
    // Not below the watchdog any more once it is gone: found by command line.
    const sleepers = () =>
      allProcesses()
        .filter((p) => p.cmd === `sleep ${seconds} `)
        .map((p) => p.pid);
    try {
      expect(stderr).to.not.include('Unhandled');
      // It ends as its command did: killed.
      expect(exit).to.deep.equal({ code: null, signal: 'SIGKILL' });
      await until('the command gone after its owner was gone first', () => sleepers().length === 0 || undefined, 5_000);
    } finally {
      for (const pid of sleepers()) process.kill(pid, 'SIGKILL');
    }
  });

  it('a managed process reports its output when it dies before it is ready', async () => {
    const p = startProcess('doomed', process.execPath, ['-e', 'console.error("boom: bad flag"); process.exit(3)']);
    try {
      await p.waitUntil(() => Promise.reject(new Error('not yet')), 5_000, 'ready');
      expect.fail('should throw');
    } catch (err) {
      expect((err as Error).message)
        .to.include('doomed exited (code 3')
        .and.include('boom: bad flag');
    }
  });
});
