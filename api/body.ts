// JSON request bodies: only application/json, within a size limit, parsed strictly. Failures
// become 400/413 in the error envelope (api/errors.ts maps the parser's errors).
import type Koa from 'koa';
import { bodyParser } from '@koa/bodyparser';
import { BadRequestError } from '../errors';

export function jsonBody(limitBytes: number): Koa.Middleware {
  const parse = bodyParser({ enableTypes: ['json'], jsonLimit: limitBytes, encoding: 'utf-8', jsonStrict: true });
  return async (ctx, next) => {
    const hasBody = Number(ctx.get('content-length') || 0) > 0 || ctx.get('transfer-encoding') !== '';
    if (!hasBody) throw new BadRequestError('Request body is required (a JSON document)');
    if (!ctx.is('application/json')) {
      throw new BadRequestError(`Content-Type must be application/json, not ${JSON.stringify(ctx.get('content-type') || 'none')}`);
    }
    await parse(ctx, next);
  };
}
