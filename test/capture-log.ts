// A logger whose JSON lines a test reads back.
import { Writable } from 'node:stream';
import { createLogger, type Logger } from '../infrastructure/log';

export function capturingLogger(level = 'info'): { logger: Logger; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const l of chunk.toString().split('\n')) if (l) lines.push(JSON.parse(l) as Record<string, unknown>);
      cb();
    },
  });
  return { logger: createLogger(level, 'test', { destination: sink }), lines };
}
