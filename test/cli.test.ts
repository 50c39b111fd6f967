import { expect } from 'chai';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { ensureTools, ToolBuildError } from '../tools/binaries';
import { freePort, startProcess } from '../tools/processes';
import { stack } from './fixture';

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

/** Runs `gateway start` and resolves once it prints its ready line, with every line it printed. */
async function startUntilReady(env: NodeJS.ProcessEnv, timeoutMs: number): Promise<{ child: ReturnType<typeof spawn>; said: string[] }> {
  const child = spawn(process.execPath, [bin, 'start'], { env, stdio: ['ignore', 'pipe', 'pipe'] });
  const said: string[] = [];
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no ready line; saw:\n${said.join('\n')}`)), timeoutMs);
    readline.createInterface({ input: child.stdout! }).on('line', (l) => {
      said.push(l);
      if (l.includes('ready')) { clearTimeout(timer); resolve(); }
    });
    child.once('exit', (code) => { clearTimeout(timer); reject(new Error(`exited ${code}:\n${said.join('\n')}`)); });
  });
  return { child, said };
}

describe('gateway CLI', () => {
  it('`gateway --help` lists the commands', () => {
    const out = spawnSync(process.execPath, [bin, '--help'], { encoding: 'utf8' });
    expect(out.status).to.equal(0);
    for (const cmd of ['start', 'api', 'worker', 'sandbox', 'tools', 'check']) expect(out.stdout).to.match(new RegExp(`^\\s+${cmd}\\b`, 'm'));
  });

  it('refuses an invalid environment variable with a message naming it', () => {
    const out = spawnSync(process.execPath, [bin, 'start'], { encoding: 'utf8', env: { ...process.env, PORT: 'http' } });
    expect(out.status).to.equal(2);
    expect(out.stderr).to.include('PORT');
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
      expect((err as Error).message).to.include("'go'").and.include('TEMPORAL_ADDRESS');
    } finally {
      process.env.PATH = savedPath;
      fs.rmSync(empty, { recursive: true, force: true });
    }
  });

  it('`gateway start` brings up the embedded stack, reuses its data, and SIGTERM stops every child', async function () {
    this.timeout(120_000);
    const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'gateway-start-'));
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      PORT: String(await freePort()), TEMPORAL_PORT: String(await freePort()), TEMPORAL_UI_PORT: String(await freePort()),
      FERRETDB_PORT: String(await freePort()), SANDBOX_PORT: String(await freePort()),
      DATA_DIR: dataDir, LOG_LEVEL: 'warn', MONGODB_URI: '', TEMPORAL_ADDRESS: '',
    };
    let firstKey = '';
    try {
      for (const round of [1, 2]) {
        const { child, said } = await startUntilReady(env, 90_000);
        expect(said.join('\n')).to.include(`Web UI http://127.0.0.1:${env.TEMPORAL_UI_PORT}`).and.include(`sandbox provider on http://127.0.0.1:${env.SANDBOX_PORT}`);
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
        expect(((await me.json()) as { data: { balance: number } }).data.balance).to.equal(10);
        const ready = await fetch(`http://127.0.0.1:${env.PORT}/readyz`);
        expect(ready.status).to.equal(200);
        const ui = await fetch(`http://127.0.0.1:${env.TEMPORAL_UI_PORT}/`);
        expect(ui.status).to.equal(200);
        // `gateway check` runs a workflow through the started worker and writes to the embedded database.
        const check = spawnSync(process.execPath, [bin, 'check'], { encoding: 'utf8', env: { ...env, TEMPORAL_ADDRESS: `127.0.0.1:${env.TEMPORAL_PORT}` } });
        expect(check.status, check.stderr).to.equal(0);
        expect(JSON.parse(check.stdout)).to.include({ ok: true });
        const children = spawnSync('pgrep', ['-P', String(child.pid)], { encoding: 'utf8' }).stdout.trim().split('\n').filter(Boolean).map(Number);
        expect(children.length).to.be.at.least(3); // temporal, ferretdb, sandbox
        if (round === 2) {
          // The workflow history of round 1 survived the restart in DATA_DIR.
          const list = spawnSync(stack.tools!.temporal, ['workflow', 'list', '--address', `127.0.0.1:${env.TEMPORAL_PORT}`, '--output', 'json'], { encoding: 'utf8' });
          expect(JSON.parse(list.stdout)).to.have.length(2);
        }
        child.kill('SIGTERM');
        const code = await new Promise((r) => child.once('exit', r));
        expect(code).to.equal(0);
        for (const pid of children) expect(alive(pid), `child ${pid} still running`).to.equal(false);
      }
    } finally {
      fs.rmSync(dataDir, { recursive: true, force: true });
    }
  });

  it('`gateway start` uses the services named by MONGODB_URI and TEMPORAL_ADDRESS instead of starting its own', async function () {
    this.timeout(60_000);
    const env: NodeJS.ProcessEnv = {
      ...process.env, PORT: String(await freePort()), SANDBOX_PORT: String(await freePort()), LOG_LEVEL: 'warn',
      MONGODB_URI: stack.mongoUri, MONGODB_DATABASE: `start_external_${Date.now()}`, TEMPORAL_ADDRESS: stack.temporalAddress,
      TEMPORAL_TASK_QUEUE: `start-external-${Date.now()}`, TOOLS_DIR: '/nonexistent-tools', DATA_DIR: path.join(stack.tmpDir, `unused-${Date.now()}`),
    };
    const { child, said } = await startUntilReady(env, 45_000);
    try {
      expect(said.join('\n')).to.not.include('FerretDB').and.not.include('Temporal dev server');
      expect((await fetch(`http://127.0.0.1:${env.PORT}/readyz`)).status).to.equal(200);
      // Only the sandbox is a child: no tools were needed (TOOLS_DIR does not even exist).
      const children = spawnSync('pgrep', ['-P', String(child.pid)], { encoding: 'utf8' }).stdout.trim().split('\n').filter(Boolean);
      expect(children).to.have.length(1);
      expect(fs.existsSync(env.DATA_DIR!)).to.equal(false);
    } finally {
      child.kill('SIGTERM');
      await new Promise((r) => child.once('exit', r));
    }
  });

  it('a managed process reports its output when it dies before it is ready', async () => {
    const p = startProcess('doomed', process.execPath, ['-e', 'console.error("boom: bad flag"); process.exit(3)']);
    try {
      await p.waitUntil(() => Promise.reject(new Error('not yet')), 5_000, 'ready');
      expect.fail('should throw');
    } catch (err) {
      expect((err as Error).message).to.include('doomed exited (code 3').and.include('boom: bad flag');
    }
  });
});
