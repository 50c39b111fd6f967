// Structured logs, one format per destination: readable lines on a terminal, JSON lines otherwise
// (or whenever LOG_FORMAT=json). Secrets never reach a log line: auth headers and key material are redacted.
import pino from 'pino';
import pretty from 'pino-pretty';

export type Logger = pino.Logger;

/** `auto`: readable on a terminal, JSON when stdout is a file or a pipe. */
export type LogFormat = 'auto' | 'json' | 'pretty';

/** `destination`: where JSON lines go instead of stdout (tests capture them); `format` applies to stdout only. */
export function createLogger(
  level: string,
  name = 'gateway',
  { destination, format = 'auto' }: { destination?: pino.DestinationStream; format?: LogFormat } = {},
): Logger {
  const readable = !destination && (format === 'pretty' || (format === 'auto' && process.stdout.isTTY === true));
  return pino(
    {
      name,
      level,
      redact: {
        paths: ['req.headers.authorization', 'headers.authorization', 'authorization', 'apiKey', 'key', '*.apiKey'],
        censor: '[redacted]',
      },
    },
    // Synchronous, so the last lines before an exit are not lost and lines keep their order.
    readable
      ? pretty({ sync: true, colorize: process.stdout.isTTY === true, translateTime: 'SYS:HH:MM:ss.l', ignore: 'pid,hostname' })
      : destination,
  );
}
