// Shared test plumbing: an isolated gateway (own database, own task queue) on the run's real services.
import { randomBytes } from 'node:crypto';
import { Writable } from 'node:stream';
import { loadConfig, type Config } from '../config';
import { createLogger, type Logger } from '../log';
import { runApiRole } from '../cli/roles';
import { freePort } from '../tools/processes';
import { stack } from './fixture';

export function uniqueName(prefix: string): string {
  return `${prefix}-${Date.now().toString(36)}-${randomBytes(3).toString('hex')}`;
}

/** A logger whose JSON lines land in an array the test can read. */
export function capturingLogger(level = 'info'): { logger: Logger; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const l of chunk.toString().split('\n')) if (l) lines.push(JSON.parse(l));
      cb();
    },
  });
  return { logger: createLogger(level, 'test', sink), lines };
}

export interface TestGateway {
  url: string;
  config: Config;
  stop(): Promise<void>;
}

export async function startTestGateway(
  opts: { withWorker?: boolean; env?: Record<string, string>; logger?: Logger; mongoUri?: string } = {},
): Promise<TestGateway> {
  const mongoUri = opts.mongoUri ?? stack.mongoUri;
  const config = loadConfig({
    PORT: String(await freePort()),
    MONGODB_URI: mongoUri,
    MONGODB_DATABASE: uniqueName('db').replace(/-/g, '_'),
    TEMPORAL_ADDRESS: stack.temporalAddress,
    TEMPORAL_TASK_QUEUE: uniqueName('tq'),
    LOG_LEVEL: 'silent',
    ...opts.env,
  });
  const logger = opts.logger ?? createLogger('silent');
  const api = await runApiRole(config, logger, { mongoUri, temporalAddress: stack.temporalAddress }, { withWorker: opts.withWorker ?? true });
  return { url: api.url, config, stop: api.stop };
}
