// A workspace's trace destinations: OTLP/HTTP endpoints its generations are sent to as spans
// (domain/traces), beside the operator's own.
import { Type } from '@sinclair/typebox';
import { KeyedRecord } from '../../infrastructure/validation/types';
import { addDestination, destinationView, listDestinations, removeDestination } from '../../domain/traces/destinations';
import { authOf } from '../auth';
import { defineRoute, type AnyRoute } from '../route';
import type { AppDeps } from '../deps';

const DestinationView = Type.Object({
  id: Type.String(),
  endpoint: Type.String(),
  header_names: Type.Array(Type.String(), { description: 'The headers sent with each export; their values are never shown' }),
  include_content: Type.Boolean(),
  created_at: Type.Integer(),
});

const NewDestination = Type.Object(
  {
    endpoint: Type.String({ maxLength: 2048, description: 'OTLP/HTTP traces URL, e.g. https://collector.example.com/v1/traces' }),
    headers: Type.Optional(
      KeyedRecord({ pattern: '^[A-Za-z0-9-]{1,64}$' }, Type.String({ maxLength: 4096, pattern: '^[\\x20-\\x7e\\t]*$' }), {
        maxProperties: 16,
        description: 'Sent with each export (an API key, for example)',
      }),
    ),
    include_content: Type.Optional(
      Type.Boolean({ description: 'Send prompts and completions too (gen_ai.input.messages, gen_ai.output.messages)' }),
    ),
  },
  { additionalProperties: false },
);

const DestinationParams = Type.Object({ id: Type.String({ pattern: '^td_[0-9a-f]{16}$' }) });

export function traceRoutes({ store, config }: AppDeps): AnyRoute[] {
  return [
    defineRoute({
      method: 'get',
      path: '/trace-destinations',
      tag: 'Traces',
      auth: 'management',
      summary: "The workspace's trace destinations",
      responses: { 200: { description: 'Destinations', schema: Type.Object({ data: Type.Array(DestinationView) }) } },
      handler: async (ctx) => {
        ctx.body = { data: (await listDestinations(store, authOf(ctx).workspaceId)).map(destinationView) };
      },
    }),
    defineRoute({
      method: 'post',
      path: '/trace-destinations',
      tag: 'Traces',
      auth: 'management',
      body: NewDestination,
      summary: "Adds a destination for the workspace's generations as OpenTelemetry spans (GenAI conventions)",
      responses: { 201: { description: 'Added', schema: Type.Object({ data: DestinationView }) } },
      handler: async (ctx, { body }) => {
        const doc = await addDestination(store, authOf(ctx).workspaceId, body, config.webhooks.allowPrivateUrls);
        ctx.status = 201;
        ctx.body = { data: destinationView(doc) };
      },
    }),
    defineRoute({
      method: 'delete',
      path: '/trace-destinations/:id',
      tag: 'Traces',
      auth: 'management',
      params: DestinationParams,
      summary: 'Removes a trace destination (within the cache period, about 5 s, every process stops sending to it)',
      responses: { 200: { description: 'Removed', schema: Type.Object({ id: Type.String(), deleted: Type.Literal(true) }) } },
      handler: async (ctx, { params }) => {
        await removeDestination(store, authOf(ctx).workspaceId, params.id);
        ctx.body = { id: params.id, deleted: true };
      },
    }),
  ];
}
