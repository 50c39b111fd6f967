// Per-request observability context for handlers: session (body wins over the x-session-id
// header), end user, trace metadata and app attribution headers.
import type Koa from 'koa';
import { BadRequestError } from '../infrastructure/errors';
import type { RequestMeta } from '../domain/accounts/attribution';

const MAX_SESSION_ID = 256;

export function requestMeta(
  ctx: Koa.Context | Koa.ParameterizedContext,
  body: { session_id?: string | null; user?: string | null; trace?: Record<string, unknown> | null } = {},
): RequestMeta {
  const header = ctx.get('x-session-id');
  if (header.length > MAX_SESSION_ID) {
    throw new BadRequestError(`x-session-id: must NOT have more than ${MAX_SESSION_ID} characters`);
  }
  const title = ctx.get('x-openrouter-title') || ctx.get('x-title');
  const categories = ctx.get('x-openrouter-categories');
  return {
    session_id: body.session_id ?? (header || null),
    user: body.user ?? null,
    trace: body.trace ?? null,
    app: {
      referer: ctx.get('http-referer') || ctx.get('referer') || null,
      title: title || null,
      categories: categories
        ? categories
            .split(',')
            .map((c) => c.trim())
            .filter(Boolean)
        : [],
    },
  };
}
