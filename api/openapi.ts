// The OpenAPI 3.1 document, generated from the same route declarations that drive validation.
import type { TSchema } from '@sinclair/typebox';
import type { AnyRoute } from './route';
import { ErrorEnvelope } from '../infrastructure/validation/types';
import { statusSummary } from '../infrastructure/errors';

/** TypeBox schemas are JSON Schema; strip the `$id`s so components can be inlined. */
function plain(schema: TSchema): unknown {
  return JSON.parse(JSON.stringify(schema), (k, v) => (k === '$id' ? undefined : v));
}

export function buildOpenApi(routes: AnyRoute[], version: string): Record<string, unknown> {
  const paths: Record<string, Record<string, unknown>> = {};
  for (const r of routes) {
    const path = r.path.replace(/:([A-Za-z_]+)/g, '{$1}');
    const parameters: unknown[] = [];
    for (const [where, schema] of [
      ['path', r.params],
      ['query', r.query],
    ] as const) {
      const props = (schema as { properties?: Record<string, TSchema>; required?: string[] } | undefined)?.properties ?? {};
      const required = (schema as { required?: string[] } | undefined)?.required ?? [];
      for (const [name, s] of Object.entries(props)) {
        parameters.push({ name, in: where, required: where === 'path' || required.includes(name), schema: plain(s) });
      }
    }
    const responses: Record<string, unknown> = {};
    for (const [status, res] of Object.entries(r.responses)) {
      const content = res.schema ? { [res.contentType ?? 'application/json']: { schema: plain(res.schema) } } : null;
      if (content && res.stream) content['text/event-stream'] = { schema: { type: 'string', description: res.stream } };
      responses[status] = content ? { description: res.description, content } : { description: res.description };
    }
    const errors = [
      '400',
      '401',
      '429',
      '500',
      ...(r.auth === 'management' ? ['403'] : []),
      ...(r.params ? ['404'] : []),
      ...(r.body ? ['413'] : []),
      ...(r.billable ? ['402', '502', '503', '524', '529'] : []),
    ];
    for (const status of errors) {
      responses[status] ??= {
        description: statusSummary(Number(status)),
        content: { 'application/json': { schema: { $ref: '#/components/schemas/ErrorEnvelope' } } },
      };
    }
    (paths[path] ??= {})[r.method] = {
      summary: r.summary,
      tags: [r.tag],
      operationId: `${r.method}${path
        .replace(/[{}]/g, '')
        .split('/')
        .map((p) => p.charAt(0).toUpperCase() + p.slice(1).replace(/[^A-Za-z0-9]/g, ''))
        .join('')}`,
      ...(r.auth === 'none' ? { security: [] } : {}),
      ...(parameters.length ? { parameters } : {}),
      ...(r.body ? { requestBody: { required: true, content: { 'application/json': { schema: plain(r.body) } } } } : {}),
      responses,
    };
  }
  return {
    openapi: '3.1.0',
    info: { title: 'Inference Gateway API', version, description: 'OpenRouter-compatible gateway: decisions, presets, batches.' },
    servers: [{ url: '/api/v1' }],
    security: [{ bearer: [] }],
    paths,
    components: {
      securitySchemes: { bearer: { type: 'http', scheme: 'bearer', description: 'API key: Authorization: Bearer <key>' } },
      schemas: { ErrorEnvelope: plain(ErrorEnvelope) },
    },
  };
}
