// POST /systemone: typed decisions. The handler checks the request, then hands the work (route,
// call the provider, compute the answers, record usage) to the configured execution mode
// (api/decision-execution): in-process by default, or as a short Temporal workflow.
import { estimateDecisionCost } from '../../decisions/estimate';
import { newGenerationId } from '../../accounts/usage-ledger';
import { BadRequestError, PayloadTooLargeError, UpstreamTimeoutError, type GatewayError } from '../../errors';
import { presetLookup, withPreset } from '../../presets/apply';
import type { DecisionsRequest } from '../../decisions/types';
import { authOf } from '../auth';
import { requestMeta } from '../request-meta';
import { requestSignal } from '../request-signal';
import { defineRoute, type AnyRoute } from '../route';
import { DecisionsResponse, decisionsRequestSchema } from '../../schemas/decisions';
import type { AppDeps } from '../deps';

/** Temporal refuses payloads over 2 MB; in workflow mode the whole request is the workflow's input. */
const MAX_REQUEST_BYTES = 1.5 * 1024 * 1024;

export function decisionRoutes({ config, store, decisions, upstreams, workspaces, metrics }: AppDeps): AnyRoute[] {
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
        const auth = authOf(ctx);
        const body = (await withPreset(given, 'decision', presetLookup(store, auth.workspaceId))) as DecisionsRequest;
        const stateBytes = Buffer.byteLength(typeof body.state === 'string' ? body.state : JSON.stringify(body.state));
        if (stateBytes > limits.maxStateBytes)
          throw new PayloadTooLargeError(`state: is ${stateBytes} bytes, more than the limit of ${limits.maxStateBytes}`);
        // The request's own length when the client sent one; measure only when it did not.
        const requestBytes = ctx.request.length ?? Buffer.byteLength(JSON.stringify(body));
        if (requestBytes > MAX_REQUEST_BYTES) throw new PayloadTooLargeError(`Decision request is larger than ${MAX_REQUEST_BYTES} bytes`);
        // Fail fast on an unknown or unsuitable model, before any work starts.
        const { model } = upstreams.catalog.resolve(body.model);
        if (model.kind !== 'decision') throw new BadRequestError(`model: ${model.id} is a ${model.kind} model, not a decision model`);
        const { settings } = await workspaces.get(auth.workspaceId);
        // Hold what the call may cost before making it, so concurrent calls cannot overspend.
        const generationId = newGenerationId('gen-dec-');
        const { signal, timedOut, done } = requestSignal(ctx, limits.timeoutMs);
        try {
          await workspaces.billed(
            auth.workspaceId,
            estimateDecisionCost(model, { questions: body.questions, stateBytes }),
            signal,
            async () => {
              try {
                const result = await decisions.run(
                  { generationId, workspaceId: auth.workspaceId, keyId: auth.keyId, request: body, meta, workspace: settings },
                  signal,
                );
                metrics.decisions.inc({ mode: decisions.mode });
                ctx.body = result;
                return result.usage.cost;
              } catch (err) {
                const mapped = timedOut()
                  ? new UpstreamTimeoutError(`Decision did not finish within ${limits.timeoutMs} ms`)
                  : (err as GatewayError);
                if (mapped.status >= 500) ctx.state.log.warn({ err, generation_id: generationId }, 'decision failed');
                throw mapped;
              }
            },
          );
        } finally {
          done();
        }
      },
    }),
  ];
}
