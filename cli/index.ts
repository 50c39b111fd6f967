#!/usr/bin/env node
// The `gateway` command: one entry point for every role and admin task.
// The roles, the embedded stack and Temporal are loaded only by the commands that run them, so a
// client command (`gateway batches watch`) starts in a fraction of the time.
// First: it must be in place before any Temporal package loads (it says why).
import '../infrastructure/temporal/activity-context';
import fs from 'node:fs';
import { Command } from 'commander';
import type { Client } from '@temporalio/client';
import { ConfigError, configuredAddresses, loadConfig, type Config } from '../infrastructure/config';
import { createLogger } from '../infrastructure/log';
import { ensureTools } from '../devstack/binaries';
import { addAdminCommands } from './admin';
import { addBatchCommands } from './batches';
// Light: it needs nothing but the logger's type, so every long-running command shares it.
import { shutdownDeadlineMs, stopOnSignals } from './signals';

function configOrExit(): Config {
  try {
    return loadConfig();
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`gateway: ${err.message}\n`);
      process.exit(2);
    }
    throw err;
  }
}

/**
 * DATA_DIR, made if missing, or the process exits saying it cannot write there: the API's usage
 * journal and the embedded services' data live there (a read-only volume failed later, as a bare
 * ENOENT).
 */
function writableDataDir(config: Config): void {
  try {
    fs.mkdirSync(config.dataDir, { recursive: true });
    fs.accessSync(config.dataDir, fs.constants.W_OK);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code ?? String(err);
    process.stderr.write(
      `gateway: DATA_DIR (${config.dataDir}) is not a directory this process can write (${code}): the usage journal and the embedded services' data are kept there\n`,
    );
    process.exit(2);
  }
}

/** The process's logger, at the configured level and format. */
function loggerFor(config: Config, name = 'gateway') {
  return createLogger(config.logLevel, name, { format: config.logFormat, bufferBytes: config.logBufferBytes });
}

function fail(err: unknown): never {
  process.stderr.write(`gateway: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(1);
}

export function buildProgram(): Command {
  const program = new Command('gateway').description('Inference gateway: typed decisions, presets, routing and durable batches');

  program
    .command('start')
    .description(
      'run everything on loopback: embedded Temporal and FerretDB (unless TEMPORAL_ADDRESS / MONGODB_URI are set), sandbox provider, worker and API',
    )
    .action(async () => {
      const config = configOrExit();
      writableDataDir(config);
      const { startAll } = await import('./start');
      await startAll(config, loggerFor(config)).catch(fail);
    });

  program
    .command('api')
    .description('run the HTTP API only (with --with-worker, also a worker in the same process)')
    .option('--with-worker', 'run a worker in the same process', false)
    .action(async (opts: { withWorker: boolean }) => {
      const config = configOrExit();
      writableDataDir(config);
      const logger = loggerFor(config, 'gateway-api');
      const { apiProcessMember, startApiProcesses } = await import('./api-processes');
      const member = apiProcessMember();
      if (!member && config.apiProcesses > 1) {
        const api = await startApiProcesses({
          count: config.apiProcesses,
          args: ['api', ...(opts.withWorker ? ['--with-worker'] : [])],
          env: process.env,
          logger,
          temporalMetricsPort: config.metrics.temporalPort,
          shutdownGraceMs: config.http.shutdownGraceMs,
          giveUp: (message) => {
            logger.fatal(message);
            process.exit(1);
          },
        }).catch(fail);
        stopOnSignals(logger, [api.stop], { deadlineMs: shutdownDeadlineMs(config.http.shutdownGraceMs) });
        return;
      }
      const { runApiRole } = await import('./roles');
      const api = await runApiRole(config, logger, configuredAddresses(config), {
        withWorker: opts.withWorker,
        embedded: member?.embedded,
        processIndex: member?.index,
      }).catch(fail);
      member?.ready(api.url);
      stopOnSignals(logger, [api.stop], { deadlineMs: shutdownDeadlineMs(config.http.shutdownGraceMs) });
    });

  program
    .command('worker')
    .description('run a Temporal worker only')
    .action(async () => {
      // No DATA_DIR check: a worker alone keeps nothing there (no journal; batch bodies are the API's).
      const config = configOrExit();
      const logger = loggerFor(config, 'gateway-worker');
      const { runWorkerRole } = await import('./roles');
      const { apiProcessMember } = await import('./api-processes');
      const member = apiProcessMember();
      const stop = await runWorkerRole(config, logger, configuredAddresses(config), { processIndex: member?.index }).catch(fail);
      member?.ready('');
      stopOnSignals(logger, [stop], { deadlineMs: shutdownDeadlineMs(config.http.shutdownGraceMs) });
    });

  program
    .command('sandbox')
    .description('run the sandbox model provider (SANDBOX_PORT)')
    .action(async () => {
      const config = configOrExit();
      const logger = loggerFor(config, 'gateway-sandbox');
      // Only the sandbox server: this process serves test and bench traffic and loads nothing else.
      const { listenSandbox } = await import('../devstack/sandbox/server');
      const sandbox = await listenSandbox('127.0.0.1', config.sandbox.port).catch(fail);
      logger.info({ url: sandbox.url }, 'sandbox provider listening');
      stopOnSignals(logger, [sandbox.close], { deadlineMs: shutdownDeadlineMs(config.http.shutdownGraceMs) });
    });

  program
    .command('tools')
    .description('build the Temporal CLI and FerretDB from Go modules into the tools cache (TOOLS_DIR)')
    .action(async () => {
      const config = configOrExit();
      const paths = await ensureTools(config.toolsDir, { temporal: true, ferretdb: true }).catch(fail);
      process.stdout.write(`${JSON.stringify(paths, null, 2)}\n`);
    });

  program
    .command('check')
    .description('end-to-end self check: a workflow whose activities write to and read from MongoDB')
    .action(async () => {
      const config = configOrExit();
      const { temporalAddress } = configuredAddresses(config);
      const { connectTemporal } = await import('../infrastructure/temporal/client');
      const { connection, client } = await connectTemporal(temporalAddress, config.temporal.namespace, loggerFor(config)).catch(fail);
      try {
        const result = await runSelfCheck(client, config.temporal.taskQueue);
        process.stdout.write(`${JSON.stringify({ ok: true, ...result })}\n`);
      } catch (err) {
        fail(err);
      } finally {
        await connection.close();
      }
    });

  program
    .command('recover-batches')
    .description(
      "give every open batch whose workflow is gone (Temporal's state lost, a run failed) a new run, which goes on where its chunks stopped; one whose run an operator terminated or cancelled is closed cancelled",
    )
    .option('--workspace <name|id>', 'only this workspace')
    .option('--json', 'print JSON')
    .action(async (o: { workspace?: string; json?: boolean }) => {
      const config = configOrExit();
      const { mongoUri, temporalAddress } = configuredAddresses(config);
      const [{ connectTemporal }, { Store }, { BatchRuns }, { recoverBatches, recoveredText }, { findWorkspace }, { Catalog }] =
        await Promise.all([
          import('../infrastructure/temporal/client'),
          import('../infrastructure/store'),
          import('../api/batch-runs'),
          import('./recover'),
          import('../domain/accounts/workspaces'),
          import('../domain/catalog'),
        ]);
      const { connection, client } = await connectTemporal(temporalAddress, config.temporal.namespace, loggerFor(config)).catch(fail);
      const store = await Store.connect(mongoUri, config.mongo.database).catch(fail);
      try {
        const catalog = Catalog.fromFile(config.catalogPath, config.catalogEnv);
        const r = await recoverBatches(store, new BatchRuns(client, config, catalog), {
          workspace: o.workspace ? (await findWorkspace(store, o.workspace))._id : undefined,
        });
        process.stdout.write(`${o.json ? JSON.stringify(r) : recoveredText(r)}\n`);
      } catch (err) {
        fail(err);
      } finally {
        await store.close();
        await connection.close();
      }
    });

  addAdminCommands(program, configOrExit);
  addBatchCommands(program);
  return program;
}

export async function runSelfCheck(client: Client, taskQueue: string): Promise<{ id: string; note: string }> {
  const { selfCheckWorkflow } = await import('../workflows/self-check');
  const id = `self-check-${Date.now().toString(36)}`;
  return client.workflow.execute(selfCheckWorkflow, {
    taskQueue,
    workflowId: id,
    args: [`checked at ${new Date().toISOString()}`],
    workflowExecutionTimeout: '30 seconds',
  });
}

if (require.main === module) {
  buildProgram().parseAsync(process.argv).catch(fail);
}
