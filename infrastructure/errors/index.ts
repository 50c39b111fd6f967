// One error hierarchy for the whole gateway. Each class carries its HTTP status; api/errors.ts turns
// any thrown value into the interface's envelope, and nothing else decides a status.

export type ErrorMetadata = Record<string, unknown>;

export abstract class GatewayError extends Error {
  abstract readonly status: number;
  constructor(
    message: string,
    readonly metadata: ErrorMetadata | null = null,
  ) {
    super(message);
    this.name = new.target.name;
  }
}

export class BadRequestError extends GatewayError {
  readonly status = 400;
}
export class UnauthorizedError extends GatewayError {
  readonly status = 401;
}
export class PaymentRequiredError extends GatewayError {
  readonly status = 402;
}
export class ForbiddenError extends GatewayError {
  readonly status = 403;
}
export class NotFoundError extends GatewayError {
  readonly status = 404;
}
export class MethodNotAllowedError extends GatewayError {
  readonly status = 405;
}
export class RequestTimeoutError extends GatewayError {
  readonly status = 408;
}
export class ConflictError extends GatewayError {
  readonly status = 409;
}
export class PayloadTooLargeError extends GatewayError {
  readonly status = 413;
}
class HeadersTooLargeError extends GatewayError {
  readonly status = 431;
}
export class UnprocessableError extends GatewayError {
  readonly status = 422;
}
export class InternalError extends GatewayError {
  readonly status = 500;
}
export class UpstreamError extends GatewayError {
  readonly status = 502;
}
export class ServiceUnavailableError extends GatewayError {
  readonly status = 503;
}
export class UpstreamTimeoutError extends GatewayError {
  readonly status = 524;
}
export class UpstreamOverloadedError extends GatewayError {
  readonly status = 529;
}

export class RateLimitedError extends GatewayError {
  readonly status = 429;
  constructor(
    message: string,
    readonly retryAfterSeconds: number,
    metadata: ErrorMetadata | null = null,
  ) {
    super(message, metadata);
  }
}

/** The constructors by status, so an error that crossed a process boundary (a Temporal failure) can be rebuilt. */
const byStatus: Record<number, new (message: string, metadata?: ErrorMetadata | null) => GatewayError> = {
  400: BadRequestError,
  401: UnauthorizedError,
  402: PaymentRequiredError,
  403: ForbiddenError,
  404: NotFoundError,
  405: MethodNotAllowedError,
  408: RequestTimeoutError,
  409: ConflictError,
  413: PayloadTooLargeError,
  422: UnprocessableError,
  431: HeadersTooLargeError,
  500: InternalError,
  502: UpstreamError,
  503: ServiceUnavailableError,
  524: UpstreamTimeoutError,
  529: UpstreamOverloadedError,
};

export function errorFromStatus(status: number, message: string, metadata: ErrorMetadata | null = null): GatewayError {
  if (status === 429) return new RateLimitedError(message, 1, metadata);
  const Ctor = byStatus[status] ?? InternalError;
  return new Ctor(message, metadata);
}

/**
 * Per status: what the API documentation calls an error, and the `type` a batch line's error
 * result names (OpenAI-style batch output). One table, so the two never disagree.
 */
const NAMES: Record<number, { summary: string; type: string }> = {
  400: { summary: 'Invalid request', type: 'invalid_request' },
  401: { summary: 'Missing or invalid API key', type: 'invalid_request' },
  402: { summary: 'Insufficient credits or storage quota', type: 'insufficient_credits' },
  403: { summary: 'Not permitted for this key', type: 'invalid_request' },
  404: { summary: 'Not found', type: 'not_found' },
  409: { summary: 'Conflict', type: 'invalid_request' },
  413: { summary: 'Payload too large', type: 'invalid_request' },
  422: { summary: 'Unprocessable', type: 'invalid_request' },
  429: { summary: 'Rate limited', type: 'rate_limited' },
  500: { summary: 'Internal error', type: 'upstream_error' },
  502: { summary: 'Upstream provider error', type: 'upstream_error' },
  503: { summary: 'Service unavailable', type: 'upstream_error' },
  524: { summary: 'Upstream timeout', type: 'timeout' },
  529: { summary: 'Upstream overloaded', type: 'overloaded' },
};

/** How the API documentation describes an error status. */
export function statusSummary(status: number): string {
  return NAMES[status]?.summary ?? (status < 500 ? 'Invalid request' : 'Internal error');
}

/** The error `type` of a failed batch line with this status. */
export function errorTypeOf(status: number): string {
  return NAMES[status]?.type ?? (status < 500 ? 'invalid_request' : 'upstream_error');
}
