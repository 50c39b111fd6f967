// POST /chat/completions, /messages, /responses and /embeddings: one call to a model, answered in
// the provider's own format, in one piece or streamed. The rules (presets, routing, billing, the
// stream's lifecycle) are the completions service's (domain/completions/service.ts); this parses and renders.
import type Koa from 'koa';
import { completionService, DROPPED_HEADER } from '../../domain/completions/service';
import type { InferenceOperation } from '../../domain/completions/formats';
import {
  ChatCompletion,
  ChatCompletionRequest,
  Embeddings,
  EmbeddingsRequest,
  Message,
  MessagesRequest,
  Response,
  ResponsesRequest,
} from '../../domain/completions/schema';
import { authOf } from '../auth';
import { admitBodyBytes, LIMIT_UNIT_BYTES } from '../rate-limit';
import { EventStream } from '../event-stream';
import { requestMeta } from '../request-meta';
import { requestSignal } from '../request-signal';
import { defineRoute, type AnyRoute } from '../route';
import type { AppDeps } from '../deps';

export function inferenceRoutes(deps: AppDeps): AnyRoute[] {
  const completions = completionService(deps);
  const { keepAliveMs, stallMs } = deps.config.inference;

  async function handle(ctx: Koa.ParameterizedContext, operation: InferenceOperation, body: Record<string, unknown>): Promise<void> {
    const { workspaceId, keyId } = authOf(ctx);
    const { signal, done } = requestSignal(ctx, null);
    try {
      const call = await completions.prepare({
        operation,
        body,
        workspaceId,
        keyId,
        meta: requestMeta(ctx, body),
        requestBytes: ctx.request.length ?? Buffer.byteLength(JSON.stringify(body)),
        signal,
        log: ctx.state.log,
      });
      // A preset's config and system prompt are parsed and sent upstream with every call naming it:
      // as much work as a body of that size, so they count as one (a 9 MB preset named by tiny
      // bodies sent 64 MB/s of prompts past the 10 MB/s the limit allows).
      if (call.presetChars >= LIMIT_UNIT_BYTES) await admitBodyBytes(deps.bodyBytes, workspaceId, call.presetChars);
      if (call.plan.stream) {
        await completions.stream(call, () => new EventStream(ctx, { 'x-generation-id': call.generationId }, keepAliveMs, stallMs));
      } else {
        const { body: answer, dropped } = await completions.answer(call);
        ctx.body = answer;
        ctx.set('x-generation-id', call.generationId);
        if (dropped.length) ctx.set(DROPPED_HEADER, [...dropped].sort().join(','));
      }
    } finally {
      done();
    }
  }

  const streamed = 'With `"stream": true`: server-sent events in this format\'s own grammar';
  return [
    defineRoute({
      method: 'post',
      path: '/chat/completions',
      tag: 'Inference',
      auth: 'any',
      billable: true,
      body: ChatCompletionRequest,
      summary: 'Chat completion (OpenAI Chat Completions shape), streamed or not',
      responses: { 200: { description: 'The completion', schema: ChatCompletion, stream: `${streamed}: data chunks, then data: [DONE]` } },
      handler: (ctx, { body }) => handle(ctx, 'chat', body),
    }),
    defineRoute({
      method: 'post',
      path: '/messages',
      tag: 'Inference',
      auth: 'any',
      billable: true,
      body: MessagesRequest,
      summary: 'Message (Anthropic Messages shape), streamed or not',
      responses: { 200: { description: 'The message', schema: Message, stream: `${streamed}: message_start … message_stop` } },
      handler: (ctx, { body }) => handle(ctx, 'messages', body),
    }),
    defineRoute({
      method: 'post',
      path: '/responses',
      tag: 'Inference',
      auth: 'any',
      billable: true,
      body: ResponsesRequest,
      summary: 'Response (OpenAI Responses shape), streamed or not',
      responses: { 200: { description: 'The response', schema: Response, stream: `${streamed}: response.created … response.completed` } },
      handler: (ctx, { body }) => handle(ctx, 'responses', body),
    }),
    defineRoute({
      method: 'post',
      path: '/embeddings',
      tag: 'Inference',
      auth: 'any',
      billable: true,
      body: EmbeddingsRequest,
      summary: 'Embeddings (OpenAI shape)',
      responses: { 200: { description: 'One embedding per input', schema: Embeddings } },
      handler: (ctx, { body }) => handle(ctx, 'embeddings', body),
    }),
  ];
}
