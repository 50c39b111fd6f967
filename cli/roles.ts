// The long-running roles a gateway process can play: the API (with an in-process worker, which
// eager workflow start needs) and a worker alone. Each returns a stop function. (The sandbox
// provider's command loads only the sandbox.)
import path from 'node:path';
import { metricsExposure, type Addresses, type Config } from '../infrastructure/config';
import type { Logger } from '../infrastructure/log';
import { Store, type UsageDoc } from '../infrastructure/store';
import { connectTemporal, pingTemporal } from '../infrastructure/temporal/client';
import { createWebhookWorker, createWorker } from '../worker';
import { startApiServer } from '../api/server';
import type { AppDeps } from '../api/deps';
import { RateLimiter } from '../domain/accounts/rate-limit';
import { bytesLimiter } from '../api/rate-limit';
import { KeptVersions, WORKER_KEPT_CHARS } from '../domain/presets/kept-versions';
import { SpendAdmission } from '../domain/accounts/spend-admission';
import { KeyCache } from '../domain/accounts/key-cache';
import { createUpstreams } from '../domain/routing/upstreams';
import { DecisionHandoff } from '../infrastructure/temporal/decision-handoff';
import { UsageLedger } from '../domain/accounts/usage-ledger';
import { UsageJournal } from '../domain/accounts/usage-journal';
import { createActivities } from '../activities';
import { Broadcaster } from '../domain/traces/broadcast';
import { decisionService } from '../domain/decisions/service';
import { inlineExecution, workflowExecution } from '../api/decision-execution';
import { startMetricsServer } from '../api/routes/metrics';
import { Metrics } from '../infrastructure/metrics';
import { createWebhookSender } from '../domain/webhooks/deliver';
import { purgeDeleted } from '../domain/batches/store';
import { recoverIfTemporalIsNew } from './recover';
import { closeStoppedBatches } from './stopped-runs';
import { BatchRuns } from '../api/batch-runs';
import { BatchBodyReader } from '../api/batch-body';
import { BodyMemory } from '../api/body-memory';
import { StorageQuota } from '../domain/accounts/storage-quota';
import { startupStep } from './startup-step';

/** How often a process looks for batch deletions left unfinished. */
const PURGE_EVERY_MS = 30_000;
import type { Stop } from './signals';

/**
 * The store, upstream clients and Temporal connection every role needs, and a worker if asked.
 * The API's synchronous routes (inline decisions included) answer once a call's usage record is in
 * the local journal (`journal`); the database write follows in groups (domain/accounts/usage-journal).
 * Batch lines and decisions run as workflows bill through the activities' ledger, straight to the
 * database. Both spend against one view of each
 * workspace's balance per process.
 */
async function startCore(config: Config, logger: Logger, addr: Addresses, withWorker: boolean, journal: boolean) {
  const store = await startupStep(
    logger,
    `connecting to MongoDB (${config.mongo.database})`,
    Store.connect(addr.mongoUri, config.mongo.database),
  );
  const metrics = new Metrics();
  const upstreams = createUpstreams(config, store, undefined, metrics);
  upstreams.stats.start();
  const { connection, client } = await startupStep(
    logger,
    `connecting to Temporal at ${addr.temporalAddress}`,
    connectTemporal(
      addr.temporalAddress,
      config.temporal.namespace,
      logger,
      config.metrics.temporalPort === null ? null : `${config.metrics.host}:${config.metrics.temporalPort}`,
    ),
  );
  const handoff = new DecisionHandoff();
  // One set of activity functions per process: the worker registers them, inline decisions call them.
  const onRecorded = (doc: UsageDoc) => metrics.billed(doc.workspace_id, doc.cost);
  // The process's one ledger; an API process journals its synchronous calls' records (see usage-ledger.ts).
  const usage = new UsageLedger(store, {
    onRecorded,
    journal: journal ? new UsageJournal(path.join(config.dataDir, 'usage-journal'), config.mongo.database) : undefined,
    onTrouble: (message, details) => logger.warn(details, message),
  });
  metrics.watchUsage(usage);
  const credits = new SpendAdmission(store, config.credits.balanceCacheMs, Date.now, (id) => usage.unstoredCost(id));
  // The OTLP exporter library would add the operator's OTEL_EXPORTER_OTLP_* headers to every
  // destination, a workspace's too: the config module has read them, so they leave the environment.
  for (const name of Object.keys(process.env)) if (name.startsWith('OTEL_EXPORTER_OTLP_')) delete process.env[name];
  const broadcast = new Broadcaster(store, {
    global: config.traces.endpoint
      ? { url: config.traces.endpoint, headers: config.traces.headers, includeContent: config.traces.includeContent }
      : null,
    allowPrivate: config.webhooks.allowPrivateUrls,
    count: (destination, outcome, n) => metrics.traceSpans.inc({ destination, outcome }, n),
    maxContentQueued: config.traces.contentQueueBytes,
    omitted: (destination) => metrics.traceContentOmitted.inc({ destination }),
  });
  const sender = createWebhookSender(config.webhooks.allowPrivateUrls);
  // Read by calls, batch lines and the presets API alike: a version never changes once written. A
  // worker alone (no journal: it serves no API) keeps less.
  const presetVersions = new KeptVersions(journal ? undefined : WORKER_KEPT_CHARS);
  const activities = createActivities({
    store,
    upstreams,
    batchSettings: config.batches,
    usage,
    credits,
    metrics,
    webhooks: { sender, timeoutMs: config.webhooks.timeoutMs },
    broadcast,
    presetVersions,
    handoff,
  });
  // Inline decisions are synchronous calls like the others: answered once their usage record is
  // journaled (the database write follows in groups), not after a round trip to the database.
  const inlineDecisions = decisionService({ upstreams, record: (r) => usage.record(r), broadcast });
  const metricsServer =
    config.metrics.port === null
      ? null
      : await startMetricsServer(metrics, { token: config.metrics.token, host: config.metrics.host, port: config.metrics.port, logger });
  const { protectedBy } = metricsExposure(config);
  if (metricsServer) logger.info({ url: metricsServer.url, protected_by: protectedBy ?? 'nothing' }, 'metrics listening');
  if (metricsServer && !protectedBy) {
    logger.warn(
      { url: metricsServer.url },
      'metrics are open to the network without METRICS_TOKEN: they name every workspace and its spend; set METRICS_TOKEN, or METRICS_HOST=127.0.0.1',
    );
  }
  let stopWorker: Stop = async () => undefined;
  if (withWorker) {
    const where = { connection, namespace: config.temporal.namespace, taskQueue: config.temporal.taskQueue, activities };
    const workers = await startupStep(
      logger,
      `creating the workers of namespace ${config.temporal.namespace}`,
      Promise.all([createWorker(where), createWebhookWorker(where)]),
    );
    const running = workers.map((w) => w.run());
    for (const r of running) r.catch((err) => logger.fatal({ err }, 'worker stopped with an error'));
    logger.info({ task_queues: workers.map((w) => w.options.taskQueue) }, 'workers polling');
    const stopped = new AbortController();
    const runs = new BatchRuns(client, config, upstreams.catalog);
    const recovery = Promise.all([
      recoverIfTemporalIsNew(store, client, runs, config, logger, stopped.signal),
      closeStoppedBatches(store, client, runs, logger, { everyMs: config.batches.stoppedRunsEveryMs, signal: stopped.signal }),
    ]);
    stopWorker = async () => {
      stopped.abort();
      // They stop between two batches; a Temporal that does not answer is not waited for.
      await Promise.race([recovery, new Promise((r) => setTimeout(r, 2_000).unref())]);
      for (const w of workers) w.shutdown();
      await Promise.all(running.map((r) => r.catch(() => undefined)));
    };
  }
  // Deleted batches' lines are removed in the background; this finishes deletions a process stopped in the middle of.
  const purger = setInterval(
    () => void purgeDeleted(store).catch((err) => logger.warn({ err }, 'batch lines not deleted yet')),
    PURGE_EVERY_MS,
  );
  purger.unref();
  const stop: Stop = async () => {
    clearInterval(purger);
    await metricsServer?.close();
    await stopWorker();
    // After the worker: the activities it let finish record through this ledger.
    await usage.close(config.http.shutdownGraceMs);
    await connection.close();
    await upstreams.close();
    await broadcast.close();
    await sender.close();
    await store.close();
  };
  return { store, upstreams, client, handoff, activities, inlineDecisions, usage, credits, metrics, broadcast, presetVersions, stop };
}

export async function runWorkerRole(config: Config, logger: Logger, addr: Addresses, opts: { processIndex?: number } = {}): Promise<Stop> {
  const core = await startCore(config, logger, addr, true, false);
  // The worker beside API processes: its batch metrics are part of theirs.
  if (opts.processIndex !== undefined) core.metrics.shareAcrossProcesses(opts.processIndex, false);
  return core.stop;
}

export async function runApiRole(
  config: Config,
  logger: Logger,
  addr: Addresses,
  opts: { withWorker: boolean; embedded?: AppDeps['embedded']; processIndex?: number },
): Promise<{ url: string; usage: UsageLedger; stop: Stop }> {
  const core = await startCore(config, logger, addr, opts.withWorker, true);
  // One of several API processes on one port: each scrape answers for all of them.
  if (opts.processIndex !== undefined) core.metrics.shareAcrossProcesses(opts.processIndex);
  const { store, upstreams, client, handoff, inlineDecisions, credits, metrics, broadcast, presetVersions, stop } = core;
  const usage = core.usage;
  const decisions =
    config.decisions.execution === 'workflow'
      ? workflowExecution(client, handoff, {
          taskQueue: config.temporal.taskQueue,
          maxInFlight: config.decisions.workflowConcurrency,
          answerWithinMs: config.temporal.answerWithinMs,
        })
      : inlineExecution(inlineDecisions);
  const batchBodies = new BatchBodyReader({
    maxDepth: config.http.bodyMaxDepth,
    maxRequests: config.batches.maxRequests,
    maxBytes: config.batches.maxBytes,
    idleMs: config.http.bodyIdleMs,
    database: { uri: addr.mongoUri, name: config.mongo.database },
  });
  batchBodies.warm();
  const bodyMemory = new BodyMemory(config.http.bodyLimitBytes);
  const storage = new StorageQuota(store, config.batches.workspaceStorageBytes, (err, detail) =>
    logger.warn({ err, ...detail }, 'stored bytes not counted'),
  );
  metrics.watchBodies({ memory: () => bodyMemory.heldBytes, disk: () => batchBodies.spooledBytes });
  const api = await startupStep(
    logger,
    `starting the API on port ${config.port}`,
    startApiServer(
      {
        config,
        logger,
        store,
        temporal: client,
        decisions,
        pingTemporal: () => pingTemporal(client),
        rateLimiter: new RateLimiter(store, config.rateLimit.requests, config.rateLimit.windowSeconds),
        workspaceRequests: new RateLimiter(store, config.rateLimit.workspaceRequests, config.rateLimit.windowSeconds),
        batchCreates: new RateLimiter(store, config.batches.createsPerMinute, 60),
        listPages: new RateLimiter(store, config.rateLimit.listPagesPerMinute, 60),
        bodyBytes: bytesLimiter(store, config.rateLimit.bodyBytesPerMinute),
        resultBytes: bytesLimiter(store, config.rateLimit.resultBytesPerMinute),
        upstreams,
        usage,
        metrics,
        broadcast,
        workspaces: credits,
        keys: new KeyCache(store, config.auth.keyCacheMs),
        batchBodies,
        bodyMemory,
        storage,
        presetVersions,
        embedded: opts.embedded,
      },
      config.host,
      config.port,
    ),
  );
  logger.info({ url: api.url, decisions_execution: decisions.mode }, 'API listening');
  if (metricsExposure(config).where === 'none') {
    logger.warn(
      { host: config.host },
      'GET /metrics is not served: the API listens beyond loopback and METRICS_TOKEN is not set (the metrics name every workspace and its spend); set METRICS_TOKEN, or METRICS_PORT (bound to METRICS_HOST, 127.0.0.1 by default)',
    );
  }
  return {
    url: api.url,
    usage,
    stop: async () => {
      await api.close();
      await batchBodies.close();
      await storage.close().catch((err) => logger.warn({ err }, 'storage quota writer not put back in the pool'));
      await stop();
    },
  };
}
