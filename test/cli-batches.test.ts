// `gateway batches …` against a running gateway, through a pipe and through a real terminal
// (`script` allocates a pty): create from a file, watch to the end, results, exit codes, memory.
import { spawn, spawnSync } from 'node:child_process';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { Client, Connection } from '@temporalio/client';
import { searchAttributes } from '../workflows/shared';
import { stack } from './fixture';
import { endpointEntry, modelEntry, providerEntry } from '../domain/catalog/entries';
import { createTenant, startTestGateway, uniqueName, writeTestCatalog, type Tenant, type TestGateway } from './helpers';

const bin = path.resolve(__dirname, '..', '..', 'bin', 'gateway.js');
const cliModule = path.resolve(__dirname, '..', 'cli', 'index.js');

/** Runs the CLI to its end; `nodeArgs` go to Node itself (a heap limit). */
function runCli(
  args: string[],
  env: NodeJS.ProcessEnv,
  nodeArgs: string[] = [],
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [...nodeArgs, bin, ...args], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c) => (stdout += c));
    child.stderr.on('data', (c) => (stderr += c));
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

/** A JSONL file of embedding lines, in the OpenAI batch-file shape. */
function linesFile(dir: string, name: string, n: number, padding = 0): string {
  const file = path.join(dir, name);
  const fd = fs.openSync(file, 'w');
  const pad = 'x'.repeat(padding);
  for (let i = 0; i < n; i += 1000) {
    let chunk = '';
    for (let j = i; j < Math.min(n, i + 1000); j++) {
      chunk += `${JSON.stringify({ custom_id: `r${j}`, method: 'POST', url: '/v1/embeddings', body: { input: `line ${j} ${pad}`, dimensions: 2 } })}\n`;
    }
    fs.writeSync(fd, chunk);
  }
  fs.closeSync(fd);
  return file;
}

describe('gateway batches (CLI)', function () {
  this.timeout(240_000);
  let gw: TestGateway;
  let t: Tenant;
  let env: NodeJS.ProcessEnv;
  let dir: string;
  let catalog: string;

  before(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cli-batches-'));
    catalog = writeTestCatalog('cli-batches', (c) => {
      c.providers.push(
        providerEntry('cli-slow', `\${SANDBOX_URL}/~run=${uniqueName('cli')},latency=3000/openai/v1`, {
          max_concurrency: 100,
          timeout_ms: 30_000,
        }),
      );
      // Slower still, for a batch that must still run when a cancel arrives from a CLI process started after it.
      c.providers.push(
        providerEntry('cli-slowest', `\${SANDBOX_URL}/~run=${uniqueName('cli')},latency=60000/openai/v1`, {
          max_concurrency: 100,
          timeout_ms: 90_000,
        }),
      );
      for (const slug of ['cli-slow', 'cli-slowest']) {
        const endpoint = endpointEntry(slug, 0.01, { pricing: { prompt: 0.01, completion: 0 }, supported_parameters: ['dimensions'] });
        c.models.push(modelEntry(`test/${slug}`, [endpoint], { kind: 'embedding', released: '20260301' }));
      }
    });
    gw = await startTestGateway({ env: { CATALOG_PATH: catalog } });
    t = await createTenant(gw.store, 50);
    env = { ...process.env, GATEWAY_URL: gw.url, GATEWAY_API_KEY: t.inferenceKey, LOG_LEVEL: 'silent' };
  });
  after(async () => {
    await gw?.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('create --file, then watch through a pipe (plain lines, exit 0), get, list and results', async () => {
    const file = linesFile(dir, 'small.jsonl', 40);
    fs.appendFileSync(file, '\n'); // a blank line is skipped
    const created = await runCli(['batches', 'create', '--file', file, '--endpoint', '/v1/embeddings', '--model', 'sandbox/embed-1'], env);
    expect(created.code, created.stderr).to.equal(0);
    const id = created.stdout.trim();
    expect(id).to.match(/^batch_/);

    const watched = await runCli(['batches', 'watch', id, '--interval', '100'], env);
    expect(watched.code, watched.stderr).to.equal(0);
    expect(watched.stdout).to.not.include('\r');
    const lines = watched.stdout.trim().split('\n');
    expect(lines.at(-1)).to.include(id).and.include('completed').and.include('40/40 (100%)').and.include('failed 0');

    const got = await runCli(['batches', 'get', id], env);
    expect(JSON.parse(got.stdout)).to.include({ id, status: 'completed', results: null });
    const listed = await runCli(['batches', 'list', '--json'], env);
    expect(JSON.parse(listed.stdout).data.map((b: { id: string }) => b.id)).to.include(id);

    const out = path.join(dir, 'results.jsonl');
    const results = await runCli(['batches', 'results', id, '--out', out], env);
    expect(results.code, results.stderr).to.equal(0);
    const rows = fs
      .readFileSync(out, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(rows.map((r) => r.custom_id)).to.deep.equal(Array.from({ length: 40 }, (_, i) => `r${i}`));
    expect(rows.every((r) => r.response?.status_code === 200)).to.equal(true);
  });

  it('watch in a real terminal draws a progress bar that ends at 100%', async () => {
    const file = linesFile(dir, 'tty.jsonl', 30);
    const created = await runCli(['batches', 'create', '--file', file, '--endpoint', '/v1/embeddings', '--model', 'sandbox/embed-1'], env);
    const id = created.stdout.trim();
    // `script` runs the command on a pseudo-terminal and passes its exit code on (-e). Spawned, not
    // spawnSync: the gateway answering it runs in this process.
    const tty = await new Promise<{ status: number | null; stdout: string }>((resolve) => {
      const child = spawn('script', ['-qefc', `${process.execPath} ${bin} batches watch ${id} --interval 100`, '/dev/null'], {
        env,
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let stdout = '';
      child.stdout.on('data', (c) => (stdout += c));
      child.on('close', (status) => resolve({ status, stdout }));
    });
    expect(tty.status, tty.stdout).to.equal(0);
    expect(tty.stdout).to.include('\r\x1b[2K[');
    expect(tty.stdout).to.match(/\[█{30}\] 100% {2}30\/30 {2}✓ 30 {2}✗ 0 {2}completed/);
  });

  it('exit codes: 1 when the batch does not complete (cancelled), 2 without a key, 1 naming the API error or the bad line', async () => {
    const file = linesFile(dir, 'slow.jsonl', 5);
    const created = await runCli(['batches', 'create', '--file', file, '--endpoint', '/v1/embeddings', '--model', 'test/cli-slowest'], env);
    const id = created.stdout.trim();
    const cancelled = await runCli(['batches', 'cancel', id], env);
    expect(cancelled.code, cancelled.stderr).to.equal(0);
    expect(cancelled.stdout).to.match(/ (cancelling|cancelled)\n$/);
    const watched = await runCli(['batches', 'watch', id, '--interval', '100'], env);
    expect(watched.code).to.equal(1);
    expect(watched.stdout.trim().split('\n').at(-1)).to.include('cancelled');

    const noKey = await runCli(['batches', 'list'], { ...env, GATEWAY_API_KEY: '' });
    expect(noKey.code).to.equal(2);
    expect(noKey.stderr).to.include('GATEWAY_API_KEY');
    const missing = await runCli(['batches', 'get', 'batch_000000000nothinghere'], env);
    expect(missing.code).to.equal(1);
    expect(missing.stderr).to.match(/404: Batch batch_000000000nothinghere not found/);
    const bad = path.join(dir, 'bad.jsonl');
    fs.writeFileSync(bad, `${JSON.stringify({ custom_id: 'a', body: { input: 'x' } })}\n{"custom_id": "b", "body": {}}\nnot json\n`);
    const refused = await runCli(['batches', 'create', '--file', bad, '--endpoint', '/v1/embeddings', '--model', 'sandbox/embed-1'], env);
    expect(refused.code).to.equal(1);
    expect(refused.stderr).to.include(`${bad}:3: not a JSON line`);
    const nothing = await runCli(
      ['batches', 'create', '--file', path.join(dir, 'absent.jsonl'), '--endpoint', '/v1/embeddings', '--model', 'm'],
      env,
    );
    expect(nothing.code).to.equal(2);
  });

  it('watch rides out a gateway that answers 503 or drops connections for a while, and gives up after --patience', async () => {
    const file = linesFile(dir, 'outage.jsonl', 5);
    const created = await runCli(['batches', 'create', '--file', file, '--endpoint', '/v1/embeddings', '--model', 'test/cli-slow'], env);
    expect(created.code, created.stderr).to.equal(0);
    const id = created.stdout.trim();
    // In front of the gateway: forwards, except for the next faults of `outage` (one a request, so
    // the watch meets each however long it takes to start), or every request while `down`.
    let outage: ('503' | 'drop')[] = [];
    let down = false;
    let failed = 0;
    const front = http.createServer((req, res) => {
      const fault = down ? '503' : outage.shift();
      if (fault) {
        failed++;
        if (fault === 'drop') return req.socket.destroy();
        res.writeHead(503, { 'content-type': 'application/json', 'retry-after': '1' });
        return res.end(JSON.stringify({ error: { code: 503, message: 'The database is unavailable right now; try again shortly' } }));
      }
      const up = http.request(`${gw.url}${req.url}`, { method: req.method, headers: req.headers }, (answer) => {
        res.writeHead(answer.statusCode!, answer.headers);
        answer.pipe(res);
      });
      req.pipe(up);
    });
    await new Promise<void>((r) => front.listen(0, '127.0.0.1', r));
    const frontUrl = `http://127.0.0.1:${(front.address() as AddressInfo).port}`;
    try {
      outage = ['503', '503', 'drop', 'drop'];
      const watched = await runCli(['batches', 'watch', id, '--interval', '100'], { ...env, GATEWAY_URL: frontUrl });
      expect(watched.code, watched.stderr).to.equal(0);
      expect(watched.stdout.trim().split('\n').at(-1)).to.include('completed').and.include('5/5');
      expect(failed).to.equal(4);
      expect(watched.stderr).to.include('503: The database is unavailable right now; try again shortly; trying again in 1s');
      expect(watched.stderr).to.include('cannot reach the gateway');

      down = true;
      const started = Date.now();
      const gaveUp = await runCli(['batches', 'watch', id, '--interval', '100', '--patience', '2'], { ...env, GATEWAY_URL: frontUrl });
      expect(gaveUp.code).to.equal(1);
      expect(Date.now() - started).to.be.within(2_000, 15_000);
      expect(gaveUp.stderr.trim().split('\n').at(-1)).to.equal('gateway: 503: The database is unavailable right now; try again shortly');
    } finally {
      front.close();
    }
  });

  it('results: a download cut off, or refused with a 503, is made again; the file appears only whole; one that keeps failing leaves none', async () => {
    const file = linesFile(dir, 'cut.jsonl', 200);
    const created = await runCli(
      ['batches', 'create', '--file', file, '--endpoint', '/v1/embeddings', '--model', 'sandbox/embed-1', '--watch'],
      env,
    );
    expect(created.code, created.stderr).to.equal(0);
    const id = /created (batch_\w+)/.exec(created.stderr)![1];
    const whole = await (
      await fetch(`${gw.url}/api/v1/batches/${id}/results`, { headers: { authorization: `Bearer ${t.inferenceKey}` } })
    ).text();
    expect(whole.length).to.be.above(10_000);
    // In front of the gateway: the first answers are cut off half way or refused, as `plan` says.
    let plan: ('cut' | '503' | 'whole')[] = [];
    const front = http.createServer((req, res) => {
      const step = plan.shift() ?? 'whole';
      if (step === '503') {
        res.writeHead(503, { 'content-type': 'application/json' });
        return res.end(JSON.stringify({ error: { code: 503, message: 'restarting' } }));
      }
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      if (step === 'whole') return res.end(whole);
      res.write(whole.slice(0, whole.length / 2), () => res.destroy());
    });
    await new Promise<void>((r) => front.listen(0, '127.0.0.1', r));
    const frontEnv = { ...env, GATEWAY_URL: `http://127.0.0.1:${(front.address() as AddressInfo).port}` };
    const out = path.join(dir, 'cut-results.jsonl');
    try {
      plan = ['cut', '503', 'whole'];
      const got = await runCli(['batches', 'results', id, '--out', out], frontEnv);
      expect(got.code, got.stderr).to.equal(0);
      expect(fs.readFileSync(out, 'utf8')).to.equal(whole);
      expect(got.stderr).to.include('the download was cut off').and.include('503: restarting; trying again');
      expect(fs.existsSync(`${out}.partial`)).to.equal(false);

      fs.rmSync(out);
      plan = Array.from({ length: 100 }, () => 'cut' as const);
      const failed = await runCli(['batches', 'results', id, '--out', out, '--patience', '1'], frontEnv);
      expect(failed.code).to.equal(1);
      expect(fs.existsSync(out)).to.equal(false); // never half a file where the whole is expected
      expect(fs.existsSync(`${out}.partial`)).to.equal(false);

      // A file that cannot be written is not the gateway's doing: not tried again.
      const blocked = path.join(dir, 'blocked');
      fs.mkdirSync(`${blocked}.partial`);
      plan = [];
      const started = Date.now();
      const local = await runCli(['batches', 'results', id, '--out', blocked], frontEnv);
      expect(local.code).to.equal(1);
      expect(local.stderr).to.include('EISDIR').and.not.include('trying again');
      expect(Date.now() - started).to.be.below(10_000);
    } finally {
      front.close();
    }
  });

  it('create --file streams a 50,000-line file: it runs in a heap too small to hold the file', async () => {
    const big = linesFile(dir, 'fifty-thousand.jsonl', 50_000, 1_000);
    expect(fs.statSync(big).size).to.be.greaterThan(50 * 1024 ** 2);
    // The CLI's modules take about 35 MB of heap; 64 MB leaves no room for a 50 MB file, as the
    // control shows: merely reading it whole and parsing its lines runs out of memory.
    const heap = ['--max-old-space-size=64'];
    const control = spawnSync(
      process.execPath,
      [
        ...heap,
        '-e',
        `require(${JSON.stringify(cliModule)}); require('fs').readFileSync(process.argv[1], 'utf8').split('\\n').filter(Boolean).map((l) => JSON.parse(l))`,
        big,
      ],
      { encoding: 'utf8' },
    );
    expect(control.status, 'holding the file in this heap must fail').to.not.equal(0);
    // An API of its own on the same database, whose task queue no worker polls: the test is about
    // the upload, and running (or cancelling) 50,000 lines would only cost time.
    const apiOnly = await startTestGateway({
      withWorker: false,
      env: { CATALOG_PATH: catalog, MONGODB_DATABASE: gw.config.mongo.database, TEMPORAL_TASK_QUEUE: uniqueName('cli-idle') },
    });
    try {
      const created = await runCli(
        ['batches', 'create', '--file', big, '--endpoint', '/v1/embeddings', '--model', 'test/cli-slow'],
        { ...env, GATEWAY_URL: apiOnly.url },
        heap,
      );
      expect(created.code, created.stderr).to.equal(0);
      const got = JSON.parse((await runCli(['batches', 'get', created.stdout.trim()], env)).stdout);
      expect(got.request_counts.total).to.equal(50_000);
      // Every line was checked as it was uploaded: the batch waits in_progress for a worker, and its
      // workflow was started so (what the Temporal UI lists) before any worker ran it.
      expect(got.status).to.equal('in_progress');
      const connection = await Connection.connect({ address: stack.temporalAddress });
      try {
        const d = await new Client({ connection }).workflow.getHandle(got.id).describe();
        expect(d.typedSearchAttributes.get(searchAttributes.batchStatus)).to.equal('in_progress');
      } finally {
        await connection.close();
      }
    } finally {
      await apiOnly.stop();
    }
  });
});
