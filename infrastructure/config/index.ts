// Every environment variable the gateway reads is declared here, once, with its default for the
// embedded dev stack. Anything invalid stops start-up with a message naming the variable.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { DEFAULT_LOG_BUFFER_BYTES } from '../log';

/** The catalog that ships with the gateway (the JSON file stays in the source tree). */
export const DEFAULT_CATALOG_PATH = path.resolve(__dirname, '..', '..', '..', 'domain', 'catalog', 'default.json');

export class ConfigError extends Error {
  constructor(variable: string, value: string, expected: string) {
    super(`Invalid environment variable ${variable}=${JSON.stringify(value)}: expected ${expected}`);
  }
}

type Env = Record<string, string | undefined>;

function read(env: Env, name: string): string | undefined {
  const v = env[name];
  return v === undefined || v.trim() === '' ? undefined : v.trim();
}

function port(env: Env, name: string, fallback: number): number {
  const raw = read(env, name);
  if (raw === undefined) return fallback;
  const n = Number(raw);
  if (!/^\d+$/.test(raw) || n < 1 || n > 65535) throw new ConfigError(name, raw, 'a TCP port from 1 to 65535');
  return n;
}

function optionalPort(env: Env, name: string): number | null {
  return read(env, name) === undefined ? null : port(env, name, 0);
}

function positiveInt(env: Env, name: string, fallback: number, min = 1, max = Infinity): number {
  const raw = read(env, name);
  if (raw === undefined) return fallback;
  if (!/^\d+$/.test(raw) || Number(raw) < min || Number(raw) > max) {
    throw new ConfigError(name, raw, max === Infinity ? `a whole number of at least ${min}` : `a whole number from ${min} to ${max}`);
  }
  return Number(raw);
}

/** The open-file limit of this process, less a quarter of it (at least 256) kept for its own work. */
export function defaultMaxConnections(limitsFile = '/proc/self/limits'): number {
  let files = 4_096; // where the limit cannot be read (not Linux)
  try {
    const soft = /^Max open files\s+(\d+|unlimited)/m.exec(fs.readFileSync(limitsFile, 'utf8'))?.[1];
    if (soft && soft !== 'unlimited') files = Number(soft);
  } catch {
    // keep the fallback
  }
  return Math.max(64, files - Math.max(256, Math.floor(files / 4)));
}

function wholeNumber(env: Env, name: string, fallback: number): number {
  const raw = read(env, name);
  if (raw === undefined) return fallback;
  if (!/^\d+$/.test(raw)) throw new ConfigError(name, raw, 'a whole number (0 or more)');
  return Number(raw);
}

function positiveNumber(env: Env, name: string, fallback: number): number {
  const raw = read(env, name);
  if (raw === undefined) return fallback;
  const n = Number(raw);
  if (!Number.isFinite(n) || n <= 0) throw new ConfigError(name, raw, 'a positive number');
  return n;
}

function oneOf<T extends string>(env: Env, name: string, allowed: readonly T[], fallback: T): T {
  const raw = read(env, name);
  if (raw === undefined) return fallback;
  if (!(allowed as readonly string[]).includes(raw)) throw new ConfigError(name, raw, `one of ${allowed.join(', ')}`);
  return raw as T;
}

function url(env: Env, name: string, protocols: string[]): string | undefined {
  const raw = read(env, name);
  if (raw === undefined) return undefined;
  let parsed: URL;
  try {
    parsed = new URL(raw);
  } catch {
    throw new ConfigError(name, redactUrl(raw), `a URL (${protocols.join(' or ')})`);
  }
  if (!protocols.includes(parsed.protocol)) throw new ConfigError(name, redactUrl(raw), `a URL (${protocols.join(' or ')})`);
  return raw;
}

function hostPort(env: Env, name: string): string | undefined {
  const raw = read(env, name);
  if (raw === undefined) return undefined;
  if (!/^[A-Za-z0-9.\-_[\]:]+:\d{1,5}$/.test(raw)) throw new ConfigError(name, raw, 'host:port');
  return raw;
}

/** Bytes from "200kb", "10mb", "1gb" or a plain number of bytes. */
function bytes(env: Env, name: string, fallback: number): number {
  const raw = read(env, name);
  if (raw === undefined) return fallback;
  const m = /^(\d+)\s*(b|kb|mb|gb)?$/i.exec(raw);
  if (!m) throw new ConfigError(name, raw, 'a size such as 1048576, 512kb or 10mb');
  const unit = { b: 1, kb: 1024, mb: 1024 ** 2, gb: 1024 ** 3 }[(m[2] ?? 'b').toLowerCase() as 'b'];
  return Number(m[1]) * unit;
}

function positiveBytes(env: Env, name: string, fallback: number): number {
  const value = bytes(env, name, fallback);
  if (value <= 0) throw new ConfigError(name, String(read(env, name)), 'a size above zero');
  return value;
}

/** Hides a password in a connection string before it reaches a message or a log. */
function redactUrl(raw: string): string {
  return raw.replace(/\/\/([^:/@]+):([^@]*)@/, '//$1:***@');
}

export function defaultToolsDir(env: Env = process.env): string {
  const cache = read(env, 'XDG_CACHE_HOME') ?? path.join(read(env, 'HOME') ?? os.homedir(), '.cache');
  return path.join(cache, 'inference-gateway', 'bin');
}

export function loadConfig(env: Env = process.env) {
  const dataDir = path.resolve(read(env, 'DATA_DIR') ?? '.data');
  const sandboxPort = port(env, 'SANDBOX_PORT', 8090);
  const sandboxUrl = url(env, 'SANDBOX_URL', ['http:', 'https:']) ?? `http://127.0.0.1:${sandboxPort}`;
  const perKey = positiveInt(env, 'RATE_LIMIT_REQUESTS', 600);
  return {
    host: read(env, 'HOST') ?? '127.0.0.1',
    port: port(env, 'PORT', 8080),
    /**
     * API processes sharing PORT (`gateway start` and `gateway api`): one per core, up to four (each
     * has its own connections and caches; past four the database is the limit).
     */
    apiProcesses: positiveInt(env, 'API_PROCESSES', Math.min(os.availableParallelism(), 4)),
    logLevel: oneOf(env, 'LOG_LEVEL', ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const, 'info'),
    /** `auto`: readable lines on a terminal, JSON lines otherwise. */
    logFormat: oneOf(env, 'LOG_FORMAT', ['auto', 'json', 'pretty'] as const, 'auto'),
    /** JSON lines waiting for stdout past this are dropped, so a reader that stops cannot take the process's memory. */
    logBufferBytes: positiveBytes(env, 'LOG_BUFFER_BYTES', DEFAULT_LOG_BUFFER_BYTES),
    dataDir,
    toolsDir: path.resolve(read(env, 'TOOLS_DIR') ?? defaultToolsDir(env)),
    mongo: {
      /** When unset, `gateway start` runs an embedded FerretDB and points this at it. */
      uri: url(env, 'MONGODB_URI', ['mongodb:', 'mongodb+srv:']),
      database: read(env, 'MONGODB_DATABASE') ?? 'gateway',
      embeddedPort: port(env, 'FERRETDB_PORT', 27017),
    },
    temporal: {
      /** When unset, `gateway start` runs an embedded Temporal dev server and points this at it. */
      address: hostPort(env, 'TEMPORAL_ADDRESS'),
      namespace: read(env, 'TEMPORAL_NAMESPACE') ?? 'default',
      taskQueue: read(env, 'TEMPORAL_TASK_QUEUE') ?? 'gateway',
      embeddedPort: port(env, 'TEMPORAL_PORT', 7233),
      uiPort: port(env, 'TEMPORAL_UI_PORT', 8233),
      /**
       * How long the API waits for Temporal to take a start or a cancel (the SDK sets no deadline of
       * its own: a frozen server held the request for as long as it was frozen). A batch's start that
       * lands later meets the batch given up, and runs nothing; a decision's begins too late, and
       * decides nothing; a cancel that lands later cancels, as the client's retry would.
       */
      answerWithinMs: 10_000,
    },
    sandbox: {
      port: sandboxPort,
      /** Fills `${SANDBOX_URL}` in the catalog's provider URLs. */
      url: sandboxUrl,
    },
    catalogPath: path.resolve(read(env, 'CATALOG_PATH') ?? DEFAULT_CATALOG_PATH),
    /**
     * The variables a catalog may name: `${VAR}` placeholders in provider URLs and each provider's
     * `api_key_env`. Provider keys are read from here only, never logged.
     */
    catalogEnv: { ...env, SANDBOX_URL: sandboxUrl } as Env,
    auth: {
      /** How long a process trusts a key it has authenticated: a revocation elsewhere applies here within this. 0 turns it off. */
      keyCacheMs: wholeNumber(env, 'KEY_CACHE_MS', 5_000),
    },
    rateLimit: {
      /** Requests each API key may make per window, counted across all API processes. */
      requests: perKey,
      /**
       * Requests each workspace may make per window over all its keys. Without it a workspace that
       * made more keys made more requests: 100 keys within their own limits took another workspace's
       * chat calls from 2,963 to 542 req/s (docs/performance.md).
       */
      workspaceRequests: positiveInt(env, 'RATE_LIMIT_WORKSPACE_REQUESTS', 10 * perKey),
      /**
       * Pages of batches or keys one workspace may list per minute, over all its keys and processes.
       * A page of 100 batches costs the stack ~12 ms of CPU, of keys ~24 ms, a chat call ~0.6:
       * counted as requests, one workspace listing within its limits could take a core and a half.
       */
      listPagesPerMinute: positiveInt(env, 'LIST_PAGES_PER_MINUTE', 600),
      /**
       * Bytes of request bodies parsed in the API process (every route's but a batch create's) one
       * workspace may send per minute, over all its keys and processes; counted in 64 KB units, so
       * smaller bodies are free. Parsing holds the event loop 5–13 ns a byte: within its request
       * limits one key sending 9.5 MB bodies held it 50–130 ms each, 600 times a minute.
       */
      bodyBytesPerMinute: bytes(env, 'BODY_BYTES_PER_MINUTE', 600 * 1024 ** 2),
      /**
       * Bytes of batch results one workspace may download per minute (`GET /batches/{id}` with its
       * results inline, `/results`), over all its keys and processes; a download that starts within
       * it runs to its end. The interface puts a finished batch's results in the batch object, so a
       * client polling a finished 50,000-line batch downloaded 28 MB a poll: four such loops took
       * another workspace's chat calls from ~2,000 to 624 req/s. 256 MB is nine such downloads.
       */
      resultBytesPerMinute: bytes(env, 'RESULT_BYTES_PER_MINUTE', 256 * 1024 ** 2),
      windowSeconds: positiveInt(env, 'RATE_LIMIT_WINDOW_SECONDS', 60),
    },
    credits: {
      /** Granted to the `default` workspace that the first start creates, so a first call works. */
      welcomeUsd: positiveNumber(env, 'WELCOME_CREDITS_USD', 10),
      /** How long a process trusts its reading of a workspace's balance before re-reading the ledger. */
      balanceCacheMs: positiveInt(env, 'BALANCE_CACHE_MS', 5_000),
    },
    decisions: {
      /** `inline`: run in the API process; `workflow`: one eagerly started Temporal workflow each. */
      execution: oneOf(env, 'DECISIONS_EXECUTION', ['inline', 'workflow'] as const, 'inline'),
      /** A decision that has not finished by then is abandoned with a 524. */
      timeoutMs: positiveInt(env, 'DECISION_TIMEOUT_MS', 120_000),
      /** Workflow mode: decisions a process runs as workflows at once; more wait in line (api/decision-execution). */
      workflowConcurrency: positiveInt(env, 'DECISION_WORKFLOW_CONCURRENCY', 20),
      maxQuestions: positiveInt(env, 'DECISION_MAX_QUESTIONS', 256),
      maxChoices: positiveInt(env, 'DECISION_MAX_CHOICES', 255),
      maxScoreLevels: positiveInt(env, 'DECISION_MAX_SCORE_LEVELS', 255),
      maxStateBytes: bytes(env, 'DECISION_MAX_STATE_BYTES', 512 * 1024),
    },
    webhooks: {
      /** Lets callback URLs be http and reach loopback and private addresses (a receiver inside your own network). */
      allowPrivateUrls: oneOf(env, 'WEBHOOKS_ALLOW_PRIVATE_URLS', ['true', 'false'] as const, 'false') === 'true',
      /** How long a terminal batch keeps trying to deliver its webhook. */
      retryWindowMs: positiveInt(env, 'WEBHOOK_RETRY_WINDOW_MS', 24 * 3_600_000),
      /** The wait before the second attempt; each later wait doubles, up to an hour. */
      firstRetryMs: 5_000,
      /** One attempt's limit: a receiver that has not answered by then counts as failed. */
      timeoutMs: positiveInt(env, 'WEBHOOK_TIMEOUT_MS', 10_000),
    },
    traces: tracesConfig(env),
    metrics: {
      /** When set, GET /metrics needs `Authorization: Bearer <token>`. */
      token: read(env, 'METRICS_TOKEN') ?? null,
      /** When set, /metrics is served on this port (by the API or a worker alone) instead of the API's. */
      port: optionalPort(env, 'METRICS_PORT'),
      /** Where the METRICS_PORT server listens: loopback unless an operator opens it (the metrics name every workspace's spend). */
      host: read(env, 'METRICS_HOST') ?? '127.0.0.1',
      /** When set, the Temporal SDK runtime serves its own Prometheus metrics (worker polls, task latencies) on this port. */
      temporalPort: optionalPort(env, 'TEMPORAL_METRICS_PORT'),
    },
    inference: {
      /**
       * The most a provider's answer (or one event of its stream) may hold: past it the call fails
       * (502) rather than the process holding whatever a broken provider sends. The largest answers
       * the interface allows (2,048 embeddings of 3,072 floats as JSON) take ~130 MB.
       */
      maxAnswerBytes: positiveBytes(env, 'UPSTREAM_MAX_ANSWER_BYTES', 256 * 1024 ** 2),
      /** A stream whose provider has been silent this long gets an SSE comment, so proxies keep it open. */
      keepAliveMs: 10_000,
      /** A client that reads nothing of its stream this long is cut off (its provider slot freed, the output so far billed). */
      stallMs: 60_000,
    },
    batches: {
      maxRequests: positiveInt(env, 'BATCH_MAX_REQUESTS', 50_000),
      maxBytes: bytes(env, 'BATCH_MAX_BYTES', 200 * 1024 ** 2),
      /**
       * Batches one workspace may create per minute, over all its keys and processes. A create costs
       * the stack ~70 ms of CPU (a workflow started and run), a chat call ~0.3: counted as requests,
       * one workspace's creates within its keys' limits took another's chat calls from 1,200 to 260
       * req/s. OpenAI allows 2,000 creations an hour; OpenRouter rate-limits creates per billable entity.
       */
      createsPerMinute: positiveInt(env, 'BATCH_CREATES_PER_MINUTE', 60),
      /**
       * Bytes of batch inputs, preset versions and keys one workspace may keep stored (domain/accounts/
       * storage-quota.ts): 50 batches of the largest size. Within its rate limits a workspace could
       * otherwise store 12 GB a minute, on the disk every workspace shares.
       */
      workspaceStorageBytes: bytes(env, 'WORKSPACE_STORAGE_BYTES', 10 * 1024 ** 3),
      /**
       * Lines per stored chunk and per chunk activity. Between two chunks a window slot runs no line
       * (the chunk's last writes, Temporal's turn, the next chunk's reads): 500 rather than 250 lines
       * took 50,000 lines at 0 ms from ~2,700 to ~3,300 lines/s (docs/performance.md).
       */
      chunkSize: positiveInt(env, 'BATCH_CHUNK_SIZE', 500),
      /** Chunk activities a batch keeps running at once (the sliding window). */
      window: positiveInt(env, 'BATCH_WINDOW', 4),
      /** Lines a chunk activity has in flight at once. */
      lineConcurrency: positiveInt(env, 'BATCH_LINE_CONCURRENCY', 64),
      /** Attempts per line for retryable upstream failures (each attempt already falls back across endpoints). */
      lineAttempts: positiveInt(env, 'BATCH_LINE_ATTEMPTS', 3),
      /**
       * How long a chunk waits out an outage (the database refusing writes, finished results kept in
       * memory; a provider refusing connections, its lines retried) before giving up on it.
       */
      outageMs: positiveInt(env, 'BATCH_OUTAGE_MS', 5 * 60_000),
      /** A chunk silent this long (its worker died) is given to another worker; chunks heartbeat every second. */
      heartbeatTimeoutMs: positiveInt(env, 'BATCH_HEARTBEAT_TIMEOUT_MS', 10_000, 2_000),
      /**
       * How long a new batch's workflow waits for the API to store the batch (it is started first)
       * before giving it up: the API failed or died in between. Far longer than storing the largest
       * batch takes.
       */
      createdWithinMs: 10 * 60_000,
      /** How often each worker looks for batches whose run an operator stopped in Temporal, to close them cancelled. */
      stoppedRunsEveryMs: positiveInt(env, 'BATCH_STOPPED_RUNS_EVERY_MS', 60_000, 100),
    },
    http: {
      bodyLimitBytes: bytes(env, 'BODY_LIMIT', 10 * 1024 ** 2),
      /** JSON bodies nested deeper than this are refused (400) before they reach a validator or the database. */
      bodyMaxDepth: positiveInt(env, 'BODY_MAX_DEPTH', 64),
      /** A request body that sends nothing for this long is refused (408) and its connection closed. */
      bodyIdleMs: positiveInt(env, 'BODY_IDLE_TIMEOUT_MS', 15_000),
      shutdownGraceMs: positiveInt(env, 'SHUTDOWN_GRACE_MS', 10_000),
      /**
       * Descriptors of the listening socket each API process accepts on while busy: up to this many
       * new connections per event-loop turn (api/acceptors.ts); 1 is Node's own single accept. At
       * most 64: each descriptor is woken by every new connection.
       */
      acceptors: positiveInt(env, 'HTTP_ACCEPTORS', 16, 1, 64),
      /**
       * Client connections per API process (api/connection-guard.ts); past it, a new connection
       * takes the place of the one idle longest. By default the process's descriptor limit less a
       * reserve for its own work (the database, providers, journal and spool files).
       */
      maxConnections: positiveInt(env, 'MAX_CONNECTIONS', defaultMaxConnections()),
    },
  };
}

export type Config = ReturnType<typeof loadConfig>;

/** `k=v,k2=v2`, values URL-encoded: the OTLP headers format. */
function otlpHeaders(env: Env, name: string): Record<string, string> {
  const raw = read(env, name);
  if (!raw) return {};
  const out: Record<string, string> = {};
  // Header values are credentials: an error names the variable, never its value.
  const invalid = () => new ConfigError(name, '(not shown)', 'comma-separated key=value pairs, values URL-encoded');
  for (const pair of raw.split(',')) {
    const at = pair.indexOf('=');
    if (at <= 0) throw invalid();
    try {
      out[pair.slice(0, at).trim()] = decodeURIComponent(pair.slice(at + 1).trim());
    } catch {
      throw invalid();
    }
  }
  return out;
}

/**
 * The operator's trace destination, by the standard OpenTelemetry variables: the traces endpoint
 * (or the base endpoint plus /v1/traces) and headers; prompts and completions go along only with
 * OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true.
 */
function tracesConfig(env: Env) {
  const base = url(env, 'OTEL_EXPORTER_OTLP_ENDPOINT', ['http:', 'https:']);
  const endpoint =
    url(env, 'OTEL_EXPORTER_OTLP_TRACES_ENDPOINT', ['http:', 'https:']) ?? (base ? `${base.replace(/\/+$/, '')}/v1/traces` : null);
  return {
    endpoint,
    headers: { ...otlpHeaders(env, 'OTEL_EXPORTER_OTLP_HEADERS'), ...otlpHeaders(env, 'OTEL_EXPORTER_OTLP_TRACES_HEADERS') },
    includeContent: oneOf(env, 'OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT', ['true', 'false'] as const, 'false') === 'true',
    /**
     * Prompts and answers a process holds queued for all trace destinations together; past it
     * spans go without them. Spans wait in each destination's queue (2,048 at most), and a slow
     * destination takes 256 every 5 s: with prompts of megabytes, one workspace within its
     * body-rate limit had the process hold 2.5 GB.
     */
    contentQueueBytes: bytes(env, 'TRACE_CONTENT_QUEUE_BYTES', 64 * 1024 ** 2),
  };
}

/** Where the `gateway batches` commands find the gateway, and the key they use. */
export function clientConfig(env: Env = process.env): { url: string; apiKey: string | null } {
  return { url: read(env, 'GATEWAY_URL') ?? 'http://127.0.0.1:8080', apiKey: read(env, 'GATEWAY_API_KEY') ?? null };
}

export interface Addresses {
  mongoUri: string;
  temporalAddress: string;
}

/** Where the services are when nothing says otherwise: the embedded stack's default ports. */
export function configuredAddresses(config: Config): Addresses {
  return {
    mongoUri: config.mongo.uri ?? `mongodb://127.0.0.1:${config.mongo.embeddedPort}/`,
    temporalAddress: config.temporal.address ?? `127.0.0.1:${config.temporal.embeddedPort}`,
  };
}

/** True for an address only this machine can reach. */
function isLoopback(host: string): boolean {
  return host === 'localhost' || host === '::1' || host === '[::1]' || /^127\.\d+\.\d+\.\d+$/.test(host);
}

/**
 * Where /metrics is served, if anywhere: on METRICS_PORT (bound to METRICS_HOST), or on the API.
 * The metrics name every workspace's spend, so the API serves them only while it listens on
 * loopback or they need METRICS_TOKEN; an API open to the network without a token does not.
 */
export function metricsExposure(config: Config): { where: 'own-port' | 'api' | 'none'; protectedBy: 'token' | 'loopback' | null } {
  const protectedBy = (host: string) => (config.metrics.token ? 'token' : isLoopback(host) ? 'loopback' : null);
  if (config.metrics.port !== null) return { where: 'own-port', protectedBy: protectedBy(config.metrics.host) };
  const api = protectedBy(config.host);
  return api ? { where: 'api', protectedBy: api } : { where: 'none', protectedBy: null };
}
