// POST /systemone: typed decisions. The handler checks the request, then hands the work (route,
// call the provider, compute the answers, record usage) to the configured execution mode
// (api/decision-execution): in-process by default, or as a short Temporal workflow.
import { admitDecision } from '../../domain/decisions/admission';
import { newGenerationId } from '../../domain/accounts/usage-ledger';
import { UpstreamTimeoutError, type GatewayError } from '../../infrastructure/errors';
import { presetLookup, withPreset } from '../../domain/presets/apply';
import type { DecisionsRequest } from '../../domain/decisions/types';
import { authOf } from '../auth';
import { requestMeta } from '../request-meta';
import { requestSignal } from '../request-signal';
import { defineRoute, type AnyRoute } from '../route';
import { DecisionsResponse, decisionsRequestSchema } from '../../domain/decisions/schema';
import type { AppDeps } from '../deps';

export function decisionRoutes({ config, store, decisions, upstreams, workspaces, metrics, presetVersions }: AppDeps): AnyRoute[] {
  const limits = config.decisions;
  return [
    defineRoute({
      method: 'post',
      path: '/systemone',
      tag: 'Decisions',
      auth: 'any',
      billable: true,
      body: decisionsRequestSchema(limits),
      summary: 'Answer typed questions (noul, choice, score) about a state, with calibrated probabilities',
      responses: { 200: { description: 'Answers, the dated model id, the provider and usage', schema: DecisionsResponse } },
      handler: async (ctx, { body: given }) => {
        const meta = requestMeta(ctx, given);
        const { workspaceId, keyId } = authOf(ctx);
        const request = (await withPreset(given, 'decision', presetLookup(store, workspaceId, presetVersions))).body as DecisionsRequest;
        const { estimate } = admitDecision(upstreams.catalog, request, {
          requestBytes: ctx.request.length,
          maxStateBytes: limits.maxStateBytes,
          // What one request may carry is what one decision may send upstream in all.
          maxPromptBytes: config.http.bodyLimitBytes,
        });
        const settings = await workspaces.settings(workspaceId);
        const generationId = newGenerationId('gen-dec-');
        const { signal, timedOut, done } = requestSignal(ctx, limits.timeoutMs);
        try {
          // What the call may cost is held before it is made, so concurrent calls cannot overspend.
          await workspaces.billed(workspaceId, estimate, signal, async () => {
            const job = { generationId, workspaceId, keyId, request, meta, workspace: settings };
            const result = await decisions.run(job, signal).catch((err: GatewayError) => {
              if (!timedOut()) throw err;
              throw new UpstreamTimeoutError(`Decision did not finish within ${limits.timeoutMs} ms`);
            });
            metrics.decisions.inc({ mode: decisions.mode });
            ctx.body = result;
            return result.usage.cost;
          });
        } catch (err) {
          if ((err as GatewayError).status >= 500) ctx.state.log.warn({ err, generation_id: generationId }, 'decision failed');
          throw err;
        } finally {
          done();
        }
      },
    }),
  ];
}
