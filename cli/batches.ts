// `gateway batches …`: the batch API from a shell, for files too big to paste into curl. Talks to
// a running gateway over HTTP (GATEWAY_URL, GATEWAY_API_KEY), like any client would.
import fs from 'node:fs';
import readline from 'node:readline';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { Command } from 'commander';
import { request } from 'undici';
import { TERMINAL_STATUSES } from '../domain/batches/schema';
import { clientConfig } from '../infrastructure/config';

/** A failure the user can act on: printed as one line, exit code 1 (2 for a usage mistake). */
class CliError extends Error {
  constructor(
    message: string,
    readonly exitCode = 1,
    /** Worth waiting out (a gateway restarting, unreachable or busy, a rate limit), and for how long at least. */
    readonly transient: { retryAfterMs: number } | null = null,
  ) {
    super(message);
  }
}

/** What writing the output file can fail with: not the gateway's doing, so not tried again. */
const LOCAL_FAILURES = new Set(['ENOSPC', 'EDQUOT', 'EACCES', 'EPERM', 'EROFS', 'ENOENT', 'ENOTDIR', 'EISDIR', 'EMFILE', 'EIO']);

/** Answers a client waits out: a rate limit, and a gateway (or what is in front of it) busy or restarting. */
const TRANSIENT_STATUSES = new Set([429, 502, 503, 504]);

interface Api {
  base: string;
  key: string;
}

function apiFromEnv(): Api {
  const { url, apiKey: key } = clientConfig();
  if (!key) throw new CliError('GATEWAY_API_KEY is not set: export the API key to use (sk-gw-v1-…)', 2);
  const base = url.replace(/\/+$/, '');
  return { base: base.endsWith('/api/v1') ? base : `${base}/api/v1`, key };
}

function parseJson(text: string): any {
  try {
    return text ? JSON.parse(text) : null;
  } catch {
    return null;
  }
}

/** A successful answer's body, unread; an error answer as a CliError naming its status and message. */
async function send(api: Api, method: 'GET' | 'POST', path: string, body?: Readable | string) {
  const res = await request(`${api.base}${path}`, {
    method,
    headers: { authorization: `Bearer ${api.key}`, ...(body !== undefined && { 'content-type': 'application/json' }) },
    body,
  }).catch((err: Error) => {
    if (err instanceof CliError) throw err; // from reading the file being sent
    throw new CliError(`cannot reach the gateway at ${api.base}: ${err.message}`, 1, { retryAfterMs: 0 });
  });
  if (res.statusCode >= 400) {
    const text = await res.body.text();
    const retryAfter = Number(res.headers['retry-after']);
    throw new CliError(
      `${res.statusCode}: ${parseJson(text)?.error?.message ?? text.slice(0, 300)}`,
      1,
      TRANSIENT_STATUSES.has(res.statusCode) ? { retryAfterMs: Number.isFinite(retryAfter) ? retryAfter * 1000 : 0 } : null,
    );
  }
  return res.body;
}

async function call(api: Api, method: 'GET' | 'POST', path: string, body?: Readable | string): Promise<any> {
  return parseJson(await (await send(api, method, path, body)).text());
}

/**
 * The create body, written as the file is read: one request line at a time, so a 50,000-line file
 * never sits in memory. Lines are OpenAI batch-file lines (`{custom_id, method, url, body}`) or just
 * `{custom_id, body}`; blank lines are skipped.
 */
async function* createBody(file: string, head: Record<string, unknown>): AsyncGenerator<string> {
  const prefix = JSON.stringify(head);
  yield `${prefix.slice(0, -1)},"requests":[`;
  const lines = readline.createInterface({ input: fs.createReadStream(file, 'utf8'), crlfDelay: Infinity });
  let n = 0;
  let written = 0;
  for await (const line of lines) {
    n++;
    if (!line.trim()) continue;
    let parsed: any;
    try {
      parsed = JSON.parse(line);
    } catch {
      throw new CliError(`${file}:${n}: not a JSON line`);
    }
    if (typeof parsed?.custom_id !== 'string' || typeof parsed.body !== 'object' || parsed.body === null) {
      throw new CliError(`${file}:${n}: a request line needs "custom_id" (a string) and "body" (an object)`);
    }
    yield `${written++ ? ',' : ''}${JSON.stringify({ custom_id: parsed.custom_id, body: parsed.body })}`;
  }
  if (!written) throw new CliError(`${file}: no request lines`);
  yield ']}';
}

interface BatchView {
  id: string;
  status: string;
  request_counts: { total: number; completed: number; failed: number };
}

const TERMINAL = new Set<string>(TERMINAL_STATUSES);
/** How long `watch` and `results` wait out failures in a row by default: a restart, a deploy. */
const PATIENCE_S = 300;
const PATIENCE_OPTION = [
  '--patience <seconds>',
  'how long failures in a row (the gateway restarting or busy) are waited out',
  String(PATIENCE_S),
] as const;
const patienceOf = (opts: { patience: string }) => Math.max(0, Number(opts.patience) || 0) * 1000;

function duration(seconds: number): string {
  if (!Number.isFinite(seconds)) return '?';
  const s = Math.round(seconds);
  return s >= 3600 ? `${Math.floor(s / 3600)}h${Math.floor((s % 3600) / 60)}m` : s >= 60 ? `${Math.floor(s / 60)}m${s % 60}s` : `${s}s`;
}

/** One line of progress: a bar on a terminal, plain words otherwise. */
function progressLine(b: BatchView, ratePerSecond: number | null, bar: boolean, width = 30): string {
  const { total, completed, failed } = b.request_counts;
  const done = completed + failed;
  const share = total ? done / total : 0;
  const pct = `${Math.floor(share * 100)}%`;
  const rate = ratePerSecond === null ? '' : `${ratePerSecond.toFixed(ratePerSecond < 10 ? 1 : 0)} lines/s`;
  const eta = ratePerSecond && !TERMINAL.has(b.status) ? `ETA ${duration((total - done) / ratePerSecond)}` : '';
  if (bar) {
    const filled = Math.round(share * width);
    return [
      `[${'█'.repeat(filled)}${'░'.repeat(width - filled)}] ${pct.padStart(4)}`,
      `${done}/${total}`,
      `✓ ${completed}`,
      `✗ ${failed}`,
      b.status,
      rate,
      eta,
    ]
      .filter(Boolean)
      .join('  ');
  }
  return [
    b.id,
    b.status,
    `${done}/${total} (${pct})`,
    `completed ${completed}`,
    `failed ${failed}`,
    rate && `rate ${rate}`,
    eta.toLowerCase(),
  ]
    .filter(Boolean)
    .join(' ');
}

/**
 * `attempt`, tried again while it fails for a reason worth waiting out (the gateway restarting or
 * unreachable, a 502/503/504, a 429: see `send`) for up to `patienceMs` of failures in a row, each
 * said on stderr; the next try after `waitMs`, or Retry-After when longer.
 */
async function patiently<T>(attempt: () => Promise<T>, waitMs: number, patienceMs: number): Promise<T> {
  const failingSince = Date.now();
  for (;;) {
    try {
      return await attempt();
    } catch (err) {
      if (!(err instanceof CliError) || !err.transient || Date.now() - failingSince >= patienceMs) throw err;
      const wait = Math.max(waitMs, err.transient.retryAfterMs);
      process.stderr.write(`${process.stdout.isTTY ? '\n' : ''}gateway: ${err.message}; trying again in ${duration(wait / 1000)}\n`);
      await new Promise((r) => setTimeout(r, wait));
    }
  }
}

/** Polls the batch until it finishes: a batch may run for hours, through a restart of the gateway. */
async function watch(api: Api, id: string, intervalMs: number, patienceMs: number): Promise<number> {
  const tty = process.stdout.isTTY === true;
  let last: { at: number; done: number } | null = null;
  let rate: number | null = null;
  for (;;) {
    const b = await patiently(
      async () => (await call(api, 'GET', `/batches/${encodeURIComponent(id)}?include_results=false`)) as BatchView,
      intervalMs,
      patienceMs,
    );
    const now = Date.now();
    const done = b.request_counts.completed + b.request_counts.failed;
    if (last && now > last.at) {
      const current = ((done - last.done) * 1000) / (now - last.at);
      rate = rate === null ? current : 0.7 * rate + 0.3 * current; // smoothed, so the ETA does not jump
    }
    last = { at: now, done };
    const line = progressLine(b, rate, tty);
    process.stdout.write(tty ? `\r\x1b[2K${line}` : `${line}\n`);
    if (TERMINAL.has(b.status)) {
      if (tty) process.stdout.write('\n');
      return b.status === 'completed' ? 0 : 1;
    }
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

/**
 * Writes a batch's results to `out`: a file appears only once it is whole (written as
 * `<out>.partial`, then renamed), and a download cut off by the gateway is made again from the start
 * (results never change once the batch is finished). To stdout, only what fails before the first
 * byte is tried again.
 */
async function download(api: Api, id: string, out: string, patienceMs: number): Promise<void> {
  const path = `/batches/${encodeURIComponent(id)}/results`;
  if (out === '-') return pipeline(await patiently(() => send(api, 'GET', path), 1_000, patienceMs), process.stdout);
  const partial = `${out}.partial`;
  await patiently(
    async () => {
      const results = await send(api, 'GET', path);
      const file = fs.createWriteStream(partial);
      try {
        await pipeline(results, file);
      } catch (err) {
        // A file still opening when the answer broke off is created after the failure: removed once closed.
        if (!file.closed) await new Promise<void>((r) => file.once('close', () => r()));
        fs.rmSync(partial, { force: true });
        // The gateway's side broke off (a restart, a reset): worth another try. The file's (a full disk) is not.
        if (LOCAL_FAILURES.has((err as NodeJS.ErrnoException).code ?? '')) throw err;
        throw new CliError(`the download was cut off: ${(err as Error).message}`, 1, { retryAfterMs: 0 });
      }
    },
    1_000,
    patienceMs,
  );
  fs.renameSync(partial, out);
}

function run(action: (...args: any[]) => Promise<number | void>) {
  return async (...args: any[]) => {
    try {
      const code = await action(...args);
      process.exitCode = code ?? 0;
    } catch (err) {
      process.stderr.write(`gateway: ${err instanceof Error ? err.message : String(err)}\n`);
      process.exitCode = err instanceof CliError ? err.exitCode : 1;
    }
  };
}

const print = (value: unknown): void => {
  process.stdout.write(`${JSON.stringify(value, null, 2)}\n`);
};

export function addBatchCommands(program: Command): void {
  const batches = program
    .command('batches')
    .description('create, watch and fetch batches on a running gateway (GATEWAY_URL, default http://127.0.0.1:8080; GATEWAY_API_KEY)');

  batches
    .command('create')
    .description('create a batch from a JSONL file of request lines ({custom_id, body} or OpenAI batch-file lines), streamed')
    .requiredOption('--file <path>', 'the JSONL file')
    .requiredOption('--endpoint <path>', '/v1/chat/completions, /v1/responses, /v1/messages or /v1/embeddings')
    .requiredOption('--model <id>', 'the model every line uses')
    .option('--completion-window <hours>', 'e.g. 24h')
    .option('--callback-url <url>', 'receives the batch when it finishes (signed webhook)')
    .option('--watch', 'then watch it until it finishes')
    .action(
      run(
        async (opts: {
          file: string;
          endpoint: string;
          model: string;
          completionWindow?: string;
          callbackUrl?: string;
          watch?: boolean;
        }) => {
          const api = apiFromEnv();
          if (!fs.existsSync(opts.file)) throw new CliError(`${opts.file}: no such file`, 2);
          const head = {
            endpoint: opts.endpoint,
            model: opts.model,
            ...(opts.completionWindow && { completion_window: opts.completionWindow }),
            ...(opts.callbackUrl && { callback_url: opts.callbackUrl }),
          };
          const b = (await call(api, 'POST', '/batches', Readable.from(createBody(opts.file, head)))) as BatchView;
          if (!opts.watch) {
            process.stdout.write(`${b.id}\n`);
            return 0;
          }
          process.stderr.write(`created ${b.id}\n`);
          return watch(api, b.id, 1000, PATIENCE_S * 1000);
        },
      ),
    );

  batches
    .command('watch <id>')
    .description('show progress until the batch finishes: exits 0 when it completed, 1 otherwise')
    .option('--interval <ms>', 'how often to look', '1000')
    .option(...PATIENCE_OPTION)
    .action(
      run(async (id: string, opts: { interval: string; patience: string }) =>
        watch(apiFromEnv(), id, Math.max(100, Number(opts.interval) || 1000), patienceOf(opts)),
      ),
    );

  batches
    .command('results <id>')
    .description('write the results as JSON Lines, streamed')
    .requiredOption('--out <path>', 'the file to write (- for stdout)')
    .option(...PATIENCE_OPTION)
    .action(run(async (id: string, opts: { out: string; patience: string }) => download(apiFromEnv(), id, opts.out, patienceOf(opts))));

  batches
    .command('list')
    .description('recent batches, newest first')
    .option('--limit <n>', 'how many', '20')
    .option('--json', 'print the API answer as JSON')
    .action(
      run(async (opts: { limit: string; json?: boolean }) => {
        const page = await call(apiFromEnv(), 'GET', `/batches?limit=${encodeURIComponent(opts.limit)}`);
        if (opts.json) return print(page);
        for (const b of page.data as BatchView[]) process.stdout.write(`${progressLine(b, null, false)}\n`);
      }),
    );

  batches
    .command('get <id>')
    .description('the batch object (without inline results)')
    .action(run(async (id: string) => print(await call(apiFromEnv(), 'GET', `/batches/${encodeURIComponent(id)}?include_results=false`))));

  batches
    .command('cancel <id>')
    .description('cancel a batch: lines in flight are stopped, finished ones keep their results')
    .action(
      run(async (id: string) => {
        const b = (await call(apiFromEnv(), 'POST', `/batches/${encodeURIComponent(id)}/cancel`)) as BatchView;
        process.stdout.write(`${b.id} ${b.status}\n`);
      }),
    );
}
