// Presets: created (or versioned) from a messages, chat or responses body by management keys;
// read by any key of the workspace.
import { Type, type TSchema } from '@sinclair/typebox';
import { ErrorEnvelope } from '../../infrastructure/validation/types';
import { addPresetVersion, deletePreset, getPreset, getVersion, listPresets, listVersions } from '../../domain/presets/store';
import { PresetOrder } from '../../domain/presets/list-order';
import { configOf, systemPromptOf, type PresetFormat } from '../../domain/presets/overlap';
import { modelNamesOf } from '../../domain/completions/request';
import { BadRequestError } from '../../infrastructure/errors';
import { authOf } from '../auth';
import { defineRoute, type AnyRoute } from '../route';
import {
  ChatBody,
  MessagesBody,
  PageQuery,
  PresetVersion,
  PresetWithVersion,
  ResponsesBody,
  SlugParams,
  VersionParams,
} from '../../domain/presets/schema';
import type { AppDeps } from '../deps';

const Created = Type.Object({ data: PresetWithVersion });

export function presetRoutes({ store, presetVersions: versions, storage }: AppDeps): AnyRoute[] {
  const order = new PresetOrder();
  const create = (format: PresetFormat, path: string, body: TSchema, what: string) =>
    defineRoute({
      method: 'post',
      path: `/presets/:slug/${path}`,
      tag: 'Presets',
      auth: 'management',
      params: SlugParams,
      body,
      summary: `Create a preset, or a new version of it, from a ${what} body (only configuration fields are stored)`,
      responses: {
        200: { description: 'The preset with its new designated version', schema: Created },
        402: { description: 'The workspace stores its quota of batch inputs, preset versions and keys', schema: ErrorEnvelope },
      },
      handler: async (ctx, { params, body: raw }) => {
        const b = raw as Record<string, unknown>;
        if (format === 'messages' && b.fallbacks != null && b.models !== undefined) {
          throw new BadRequestError('fallbacks: cannot be combined with models');
        }
        modelNamesOf(b); // a preset no call could use is refused now (400), not on every call
        const auth = authOf(ctx);
        ctx.body = {
          data: await addPresetVersion(
            store,
            {
              workspaceId: auth.workspaceId,
              slug: params.slug,
              creator: auth.keyId,
              config: configOf(format, b),
              systemPrompt: systemPromptOf(format, b),
            },
            storage,
          ),
        };
      },
    });
  return [
    create('messages', 'messages', MessagesBody, 'Messages (Anthropic-style)'),
    create('chat', 'chat/completions', ChatBody, 'Chat Completions'),
    create('responses', 'responses', ResponsesBody, 'Responses'),
    defineRoute({
      method: 'get',
      path: '/presets',
      tag: 'Presets',
      auth: 'any',
      query: PageQuery,
      summary: "The workspace's presets, most recently updated first",
      responses: {
        200: {
          description: 'A page of presets',
          schema: Type.Object({ data: Type.Array(PresetWithVersion), total_count: Type.Integer() }),
        },
      },
      handler: async (ctx, { query }) => {
        ctx.body = await listPresets(store, authOf(ctx).workspaceId, query.offset, query.limit, { order, versions });
      },
    }),
    defineRoute({
      method: 'get',
      path: '/presets/:slug',
      tag: 'Presets',
      auth: 'any',
      params: SlugParams,
      summary: 'One preset with its designated version',
      responses: { 200: { description: 'The preset', schema: Created } },
      handler: async (ctx, { params }) => {
        ctx.body = { data: await getPreset(store, authOf(ctx).workspaceId, params.slug, versions) };
      },
    }),
    defineRoute({
      method: 'delete',
      path: '/presets/:slug',
      tag: 'Presets',
      auth: 'management',
      params: SlugParams,
      summary: 'Delete a preset with all its versions (its slug may be created again, from version 1)',
      responses: {
        200: {
          description: 'Deleted: calls naming it are a 404 from now on',
          schema: Type.Object({ data: Type.Object({ id: Type.String(), slug: Type.String(), deleted: Type.Literal(true) }) }),
        },
      },
      handler: async (ctx, { params }) => {
        const { id } = await deletePreset(store, authOf(ctx).workspaceId, params.slug, storage);
        ctx.body = { data: { id, slug: params.slug, deleted: true } };
      },
    }),
    defineRoute({
      method: 'get',
      path: '/presets/:slug/versions',
      tag: 'Presets',
      auth: 'any',
      params: SlugParams,
      query: PageQuery,
      summary: "A preset's versions, oldest first",
      responses: {
        200: { description: 'A page of versions', schema: Type.Object({ data: Type.Array(PresetVersion), total_count: Type.Integer() }) },
      },
      handler: async (ctx, { params, query }) => {
        ctx.body = await listVersions(store, authOf(ctx).workspaceId, params.slug, query.offset, query.limit, versions);
      },
    }),
    defineRoute({
      method: 'get',
      path: '/presets/:slug/versions/:version',
      tag: 'Presets',
      auth: 'any',
      params: VersionParams,
      summary: 'One version of a preset',
      responses: { 200: { description: 'The version', schema: Type.Object({ data: PresetVersion }) } },
      handler: async (ctx, { params }) => {
        ctx.body = { data: await getVersion(store, authOf(ctx).workspaceId, params.slug, params.version, versions) };
      },
    }),
  ];
}
