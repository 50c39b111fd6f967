// Everything needed to call model providers, built once per process and passed in: the catalog,
// keep-alive HTTP, per-provider concurrency limits and live statistics. `invoke` is the one way
// decisions and batch lines reach a provider: route ▶ execute with fallbacks ▶ price.
import type { Config } from '../../infrastructure/config';
import { Catalog, type CatalogModel, type Endpoint, type ModelVariant, type Operation } from '../catalog';
import type { ProviderPreferences } from './preferences';
import { callEndpoint } from './endpoint-call';
import type { Usage } from '../../infrastructure/providers/formats';
import { costOf } from '../catalog/usd';
import { ProviderHttp } from '../../infrastructure/providers/http';
import { ProviderLimiter } from '../../infrastructure/providers/limiter';
import type { Store } from '../../infrastructure/store';
import { optionsFor, planRoute, type PricedExtras, type RoutePlan } from './engine';
import { executePlan, type Attempt } from './execute';
import { LiveStats } from './stats';
import { unobserved, type UpstreamObserver } from '../../infrastructure/metrics';
import { withFields } from '../../infrastructure/objects/with-fields';

export interface Upstreams {
  catalog: Catalog;
  http: ProviderHttp;
  limiter: ProviderLimiter;
  stats: LiveStats;
  /** Where each provider call and fallback is reported (the process's metrics). */
  observer: UpstreamObserver;
  env: Record<string, string | undefined>;
}

export function createUpstreams(
  config: Config,
  store: Store,
  catalog = Catalog.fromFile(config.catalogPath, config.catalogEnv),
  observer: UpstreamObserver = unobserved,
): Upstreams & { close(): Promise<void> } {
  const stats = new LiveStats(store);
  const http = new ProviderHttp(config.inference.maxAnswerBytes);
  return {
    catalog,
    http,
    stats,
    limiter: new ProviderLimiter(),
    observer,
    env: config.catalogEnv,
    close: async () => {
      await stats.stop();
      await http.close();
    },
  };
}

export interface InvokeRequest {
  /** Whose call it is (the provider limiter serves waiting workspaces by the slots they hold). */
  workspaceId?: string;
  models: CatalogModel[];
  variant?: ModelVariant;
  /** What the call asks for beyond tokens, which only endpoints priced for it serve (engine.ts). */
  extras?: PricedExtras;
  operation: Operation;
  preferences?: ProviderPreferences;
  workspace?: { only?: string[]; ignore?: string[] };
  /** Parameter names the request supplies, for `require_parameters`. */
  parameters?: string[];
  /** The sticky-routing key: workspace and session id (see engine.ts). */
  session?: string;
  /** The upstream request body; the adapter sets the upstream model id. */
  body: Record<string, unknown> | ((endpoint: Endpoint) => Record<string, unknown>);
  signal?: AbortSignal;
  queueWaitMs?: number;
}

export interface Invocation {
  endpoint: Endpoint;
  body: any;
  usage: Usage;
  cost: number;
  latencyMs: number;
  attempts: Attempt[];
  /** Parameters the serving provider's format could not take. */
  dropped: string[];
}

/** The endpoints to try for a request, in order, from the live statistics. */
export function routeFor(up: Upstreams, req: InvokeRequest): RoutePlan {
  return planRoute({
    models: req.models,
    variant: req.variant,
    extras: req.extras,
    operation: req.operation,
    preferences: req.preferences,
    workspace: req.workspace,
    parameters: req.parameters,
    session: req.session,
    stats: up.stats.snapshot(),
    now: Date.now(),
    random: Math.random,
  });
}

export async function invoke(up: Upstreams, req: InvokeRequest): Promise<Invocation> {
  const plan = routeFor(up, req);
  const { endpoint, response, attempts } = await executePlan(
    plan,
    (e, signal) => {
      const body = typeof req.body === 'function' ? req.body(e) : req.body;
      const requireParameters = req.preferences?.require_parameters === true;
      return callEndpoint(up.http, e, req.operation, withFields(body, optionsFor(e, req.preferences)), {
        signal,
        env: up.env,
        requireParameters,
      });
    },
    {
      limiter: up.limiter,
      stats: up.stats,
      observer: up.observer,
      signal: req.signal,
      queueWaitMs: req.queueWaitMs,
      workspaceId: req.workspaceId,
    },
  );
  return {
    endpoint,
    body: response.body,
    usage: response.usage,
    cost: costOf(endpoint, response.usage),
    latencyMs: response.latencyMs,
    attempts,
    dropped: response.dropped,
  };
}

/** The sticky-routing key of a call: its session id within its workspace (sessions of two workspaces never collide). */
export function sessionKey(workspaceId: string, sessionId: string | null | undefined): string | undefined {
  return sessionId ? `${workspaceId}\n${sessionId}` : undefined;
}
