// Bearer-key authentication for /api/v1. Unknown, malformed and revoked keys are all "invalid":
// a caller learns nothing about which keys exist.
import type Koa from 'koa';
import { ForbiddenError, UnauthorizedError } from '../infrastructure/errors';
import type { KeyKind } from '../infrastructure/store';
import type { AppDeps } from './deps';

/** `none`: public; `any`: any live key; `management`: management keys only. */
export type AuthLevel = 'none' | 'any' | 'management';

export interface AuthContext {
  keyId: string;
  workspaceId: string;
  kind: KeyKind;
  /** The key's name and label, which never change: `GET /key` answers from them without a read. */
  name: string;
  label: string;
}

/** The token of an `Authorization: Bearer <token>` header, or null when it has another form. */
export function bearerToken(header: string): string | null {
  return /^Bearer\s+(\S+)\s*$/i.exec(header)?.[1] ?? null;
}

export function authenticate(deps: AppDeps, level: Exclude<AuthLevel, 'none'>): Koa.Middleware {
  return async (ctx, next) => {
    const header = ctx.get('authorization');
    // Anthropic's clients send the key as x-api-key; everything else as a bearer token.
    const apiKey = header ? null : ctx.get('x-api-key');
    if (!header && !apiKey) throw new UnauthorizedError('Missing Authentication header: send Authorization: Bearer <API key>');
    const token = header ? bearerToken(header) : null;
    if (header && !token) throw new UnauthorizedError("Malformed Authorization header: expected 'Bearer <API key>'");
    const key = await deps.keys.authenticate(token ?? apiKey!.trim());
    if (!key) throw new UnauthorizedError('Invalid or revoked API key');
    const auth: AuthContext = { keyId: key.id, workspaceId: key.workspace_id, kind: key.kind, name: key.name, label: key.label };
    ctx.state.auth = auth;
    ctx.state.userId = key.id;
    if (level === 'management' && key.kind !== 'management') {
      throw new ForbiddenError('Only management keys can perform this operation');
    }
    await next();
  };
}

export function authOf(ctx: Koa.Context | Koa.ParameterizedContext): AuthContext {
  return ctx.state.auth as AuthContext;
}
