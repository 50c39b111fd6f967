// Structured JSON logs. Secrets never reach a log line: auth headers and key material are redacted.
import pino from 'pino';

export type Logger = pino.Logger;

export function createLogger(level: string, name = 'gateway', destination?: pino.DestinationStream): Logger {
  return pino(
    {
      name,
      level,
      redact: {
        paths: ['req.headers.authorization', 'headers.authorization', 'authorization', 'apiKey', 'key', '*.apiKey'],
        censor: '[redacted]',
      },
    },
    destination,
  );
}
