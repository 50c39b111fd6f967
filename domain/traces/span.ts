// A generation (a chat call, a decision, a batch line) as an OpenTelemetry span with the GenAI
// semantic conventions: model, provider, tokens, cost, finish reason, latency; the caller's trace
// config mapped onto it (trace_id, parent_span_id, span_name / generation_name, trace_name) and
// its other keys as attributes; prompts and completions only when the destination asks for them.
import { createHash } from 'node:crypto';
import type { Attributes } from '@opentelemetry/api';
import type { SpanRecord } from '../../infrastructure/tracing';

export interface Generation {
  workspaceId: string;
  /** Our generation id. */
  id: string;
  /** The API it came through: chat, messages, responses, embeddings, decision. */
  api: string;
  kind: 'completion' | 'decision' | 'batch_line';
  requestedModel: string | null;
  /** The dated model id that answered. */
  model: string;
  provider: string | null;
  usage: { input_tokens: number; output_tokens: number };
  cost: number;
  finishReason: string | null;
  startedAt: number;
  endedAt: number;
  meta: { session_id: string | null; user: string | null; trace: Record<string, unknown> | null };
  batchId?: string | null;
  error?: string | null;
  /** The prompt and the answer, read only for a destination that asked for content. */
  content?: () => { input: unknown; output: unknown };
}

const hex = (text: string, digits: number) => createHash('sha256').update(text).digest('hex').slice(0, digits);

/** The caller's id as OpenTelemetry's: kept when it is already one, else a stable hash of it (one trace per trace_id). */
function idOf(value: unknown, digits: number, workspaceId: string): string | null {
  if (typeof value !== 'string' || !value) return null;
  const v = value.toLowerCase();
  if (new RegExp(`^[0-9a-f]{${digits}}$`).test(v) && !/^0+$/.test(v)) return v;
  return hex(`${workspaceId}\n${value}`, digits);
}

const MAPPED = new Set(['trace_id', 'trace_name', 'span_name', 'generation_name', 'parent_span_id']);

const scalar = (v: unknown) => (typeof v === 'string' || typeof v === 'number' || typeof v === 'boolean' ? v : JSON.stringify(v));

export function generationSpan(g: Generation, withContent: boolean): SpanRecord {
  const t = g.meta.trace ?? {};
  const operation = g.api === 'embeddings' ? 'embeddings' : 'chat';
  const attributes: Attributes = {
    'gen_ai.operation.name': operation,
    'gen_ai.provider.name': g.provider ?? 'unknown',
    'gen_ai.request.model': g.requestedModel ?? g.model,
    'gen_ai.response.model': g.model,
    'gen_ai.response.id': g.id,
    'gen_ai.usage.input_tokens': g.usage.input_tokens,
    'gen_ai.usage.output_tokens': g.usage.output_tokens,
    'gateway.cost_usd': g.cost,
    'gateway.api': g.api,
    'gateway.kind': g.kind,
    'gateway.workspace_id': g.workspaceId,
  };
  if (g.finishReason) attributes['gen_ai.response.finish_reasons'] = [g.finishReason];
  if (g.meta.session_id) attributes['gen_ai.conversation.id'] = g.meta.session_id;
  if (g.meta.user) attributes['user.id'] = g.meta.user;
  if (g.batchId) attributes['gateway.batch_id'] = g.batchId;
  if (typeof t.trace_name === 'string') attributes['gateway.trace_name'] = t.trace_name;
  if (typeof t.generation_name === 'string') attributes['gateway.generation_name'] = t.generation_name;
  for (const [k, v] of Object.entries(t)) if (!MAPPED.has(k) && v !== null && v !== undefined) attributes[`gateway.trace.${k}`] = scalar(v);
  if (withContent && g.content) {
    const { input, output } = g.content();
    attributes[CONTENT_ATTRIBUTES[0]] = JSON.stringify(input);
    attributes[CONTENT_ATTRIBUTES[1]] = JSON.stringify(output);
  }
  const name =
    (typeof t.span_name === 'string' && t.span_name) ||
    (typeof t.generation_name === 'string' && t.generation_name) ||
    `${operation} ${g.model}`;
  return {
    name,
    traceId: idOf(t.trace_id, 32, g.workspaceId) ?? hex(`${g.id}\n${Math.random()}`, 32),
    parentSpanId: idOf(t.parent_span_id, 16, g.workspaceId),
    startMs: g.startedAt,
    endMs: Math.max(g.endedAt, g.startedAt),
    attributes,
    error: g.error ?? null,
  };
}

const CONTENT_ATTRIBUTES = ['gen_ai.input.messages', 'gen_ai.output.messages'] as const;

/** The characters of the prompt and answer a span carries (0 without them). */
export function contentSize(s: SpanRecord): number {
  let n = 0;
  for (const key of CONTENT_ATTRIBUTES) {
    const v = s.attributes[key];
    if (typeof v === 'string') n += v.length;
  }
  return n;
}

/** A span without content for a destination that asked for it, saying why: too much content was waiting to be sent. */
export function contentOmitted(plain: SpanRecord): SpanRecord {
  return { ...plain, attributes: { ...plain.attributes, 'gateway.content_omitted': 'content_backlog' } };
}

/** Why an answer ended, in any of the answer formats (null when it does not say). */
export function finishReasonOf(body: any): string | null {
  const reason = body?.choices?.[0]?.finish_reason ?? body?.stop_reason ?? body?.incomplete_details?.reason ?? body?.status;
  return typeof reason === 'string' ? reason : null;
}
