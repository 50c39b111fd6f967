// Connections to the Temporal server. The API process shares one NativeConnection between its
// client and its in-process worker, which eager workflow start requires.
import { GATEWAY_ERROR_TYPE } from '../../workflows/shared';
import { decisionWorkflow } from '../../workflows/decision';
import { NativeConnection, Runtime, makeTelemetryFilterString } from '@temporalio/worker';
import type { Logger } from '../log';
import { Client, type CallContext } from '@temporalio/client';
import type { AsyncLocalStorage } from 'node:async_hooks';
import { SyncScope } from './sync-scope';

export interface TemporalHandles {
  connection: NativeConnection;
  client: Client;
}

/**
 * The SDK's connection, its call context (a deadline, metadata or an abort signal for the calls
 * made within `withDeadline` and the like) kept in a SyncScope (sync-scope.ts says why): the worker
 * runs every activity inside the connection's `withAbortSignal`. Nothing of ours makes a call
 * after an `await` within one.
 */
class Connection extends NativeConnection {
  override readonly callContextStorage = new SyncScope<CallContext>() as unknown as AsyncLocalStorage<CallContext>;
}

let runtimeInstalled = false;

/** Routes the SDK's own logs into ours. Must run before the first connection creates the runtime. */
function installRuntime(logger: Logger, metricsAddress: string | null): void {
  if (runtimeInstalled) return;
  runtimeInstalled = true;
  // The SDK narrates worker state changes at info; keep only its warnings unless debugging.
  const log = logger.child({ component: 'temporal-sdk' }, { level: logger.levelVal < 30 || logger.levelVal > 40 ? logger.level : 'warn' });
  // A decision that fails with a gateway error (an upstream 502, a 404 …) is an answer, not an incident.
  const expected = (meta: Record<string, unknown> | undefined) =>
    (meta?.error as { type?: string } | undefined)?.type === GATEWAY_ERROR_TYPE || meta?.workflowType === decisionWorkflow.name;
  const at = (level: string) =>
    level === 'TRACE' ? 'trace' : level === 'DEBUG' ? 'debug' : level === 'WARN' ? 'warn' : level === 'ERROR' ? 'error' : 'info';
  Runtime.install({
    // Our own handler stops the worker once; the SDK's would stop it again (IllegalStateError).
    shutdownSignals: [],
    logger: {
      log: (level, message, meta) => log[level === 'WARN' && expected(meta) ? 'debug' : at(level)](meta ?? {}, message),
      trace: (message, meta) => log.trace(meta ?? {}, message),
      debug: (message, meta) => log.debug(meta ?? {}, message),
      info: (message, meta) => log.info(meta ?? {}, message),
      warn: (message, meta) => (expected(meta) ? log.debug(meta ?? {}, message) : log.warn(meta ?? {}, message)),
      error: (message, meta) => log.error(meta ?? {}, message),
    },
    telemetryOptions: {
      logging: { filter: makeTelemetryFilterString({ core: 'WARN' }), forward: {} },
      // The SDK core's own Prometheus endpoint (worker polls, task and activity latencies), on request.
      ...(metricsAddress === null ? {} : { metrics: { prometheus: { bindAddress: metricsAddress } } }),
    },
  });
}

export async function connectTemporal(
  address: string,
  namespace: string,
  logger: Logger,
  /** `host:port` for the SDK runtime's Prometheus endpoint, if wanted. */
  metricsAddress: string | null = null,
): Promise<TemporalHandles> {
  installRuntime(logger, metricsAddress);
  const connection = await Connection.connect({ address });
  const client = new Client({ connection, namespace });
  return { connection, client };
}

const pings = new WeakMap<Client, Promise<unknown>>();

/**
 * A cheap round trip to the server; the caller bounds how long it waits (/readyz does). One ping at
 * a time per client: a probe while one is unanswered shares it.
 */
export function pingTemporal(client: Client): Promise<unknown> {
  let ping = pings.get(client);
  if (!ping) {
    ping = client.workflowService.getSystemInfo({}).finally(() => pings.delete(client));
    ping.catch(() => undefined); // a failure nobody waits for any more is nobody's
    pings.set(client, ping);
  }
  return ping;
}
