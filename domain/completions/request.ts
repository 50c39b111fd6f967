// From what a client sent to what the gateway does: the preset applied, the models to try in order
// (`model`, then `models`/`fallbacks`), the routing preferences, the body the provider gets (without
// the gateway's own fields) and the parameters it supplies (for `require_parameters`).
import type { Catalog, CatalogModel, Endpoint, ModelVariant } from '../catalog';
import { BadRequestError } from '../../infrastructure/errors';
import type { ProviderPreferences } from '../routing/preferences';
import type { InferenceOperation } from './formats';
import { refuseUnpricedTools, searchField } from './server-tools';
import { audioFields } from './media';
import { pluginsNotRun, webPluginField, withWebPlugin } from './plugins';
import { servesExtras, servesOperation, servesTier, tierOptIn, type PricedExtras } from '../routing/engine';

type Body = Record<string, any>;

/** Fields the gateway reads and never forwards: routing, presets, attribution, streaming controls. */
const GATEWAY_FIELDS = [
  'model',
  'models',
  'fallbacks',
  'preset',
  'provider',
  'route',
  'plugins',
  'transforms',
  'session_id',
  'trace',
  'usage',
  'stream',
  'stream_options',
] as const;

/** What a provider is sent of a request body: everything but the gateway's own fields (calls and batch lines alike). */
export function upstreamBodyOf(body: Body): Body {
  const upstream: Body = {};
  for (const [k, v] of Object.entries(body)) if (!(GATEWAY_FIELDS as readonly string[]).includes(k)) upstream[k] = v;
  return upstream;
}

/** Fields that carry the conversation rather than a generation parameter. */
const CONTENT_FIELDS = new Set(['messages', 'input', 'system', 'instructions', 'user', 'metadata']);

/** The most models one request may name (the model and its fallbacks). */
const MAX_MODELS = 8;

export interface InferencePlan {
  models: CatalogModel[];
  variant: ModelVariant;
  preferences: ProviderPreferences | undefined;
  /** What the provider is sent, less the model id its endpoint sets. */
  upstreamBody: Body;
  /** Generation parameters the request supplies. */
  parameters: string[];
  stream: boolean;
  /** The client asked for usage in the stream. */
  includeUsage: boolean;
  /** The output tokens the request allows, if it says. */
  maxOutputTokens: number | null;
  /** Answers the provider generates (and bills) for it: a chat call's `n` (other formats have one; batch lines take n=1 only). */
  choices: number;
  /** What it asks for that a provider bills beyond tokens (a tier, web searches, audio): only endpoints priced for it serve the call. */
  extras: PricedExtras;
  /** Plugins it names that are not run (`plugins.<id>`): the answer names them with the parameters dropped. */
  notRun: string[];
}

/**
 * The models a body names, each once, in the order they are tried: `model`, then `models` and
 * `fallbacks`; at most MAX_MODELS (a preset is held to it when it is created, not only when used).
 */
export function modelNamesOf(body: Body): string[] {
  const fallbackNames: string[] = [
    ...(Array.isArray(body.models) ? body.models : []),
    ...(Array.isArray(body.fallbacks) ? body.fallbacks.map((f: Body) => f.model) : []),
  ];
  const first = typeof body.model === 'string' && body.model ? body.model : fallbackNames.shift();
  if (!first) throw new BadRequestError('model: is required (or models, or a preset that names one)');
  const names = [...new Set([first, ...fallbackNames])];
  if (names.length > MAX_MODELS) throw new BadRequestError(`models: at most ${MAX_MODELS} models in all, got ${names.length}`);
  return names;
}

/**
 * Tiers a provider bills away from its standard prices, and how a call asks for them: OpenAI's
 * priority processing (about twice the standard price) and flex processing (about half), and
 * Anthropic's fast mode (two to six times). A call asking for one goes only to endpoints the
 * catalog lists for that tier, at their prices; one the catalog lists none for is refused. Read
 * once a preset is applied (a preset may store them).
 */
const TIER_SETTINGS: Partial<Record<InferenceOperation, { field: string; values: string[] }>> = {
  chat: { field: 'service_tier', values: ['priority', 'flex'] },
  responses: { field: 'service_tier', values: ['priority', 'flex'] },
  messages: { field: 'speed', values: ['fast'] },
};

/** The provider tier a call asks for (null: the standard one). */
function tierOf(body: Body, operation: InferenceOperation): string | null {
  const setting = TIER_SETTINGS[operation];
  const value: unknown = setting && body[setting.field];
  return typeof value === 'string' && setting!.values.includes(value) ? value : null;
}

/** How a call is routed: its variant and preferences may opt in to tiers it does not ask for. */
interface RouteAsked {
  variant: ModelVariant;
  preferences: ProviderPreferences | undefined;
}

/**
 * The body as the provider is asked for it (its web plugin made the format's own search, plugins.ts),
 * and what it asks for that a provider bills beyond tokens; a 400 for what no endpoint of the
 * models is priced for (checkBilled). Calls and batch lines alike, once a preset is applied.
 */
export function billedRequest(
  models: CatalogModel[],
  requested: Body,
  operation: InferenceOperation,
  route: RouteAsked,
): { body: Body; extras: PricedExtras } {
  const body = withWebPlugin(requested, operation, route.variant);
  return { body, extras: checkBilled(models, body, operation, route) };
}

/**
 * A 400 for what a provider would bill beyond the catalog's prices: an unpriced server tool, a tier
 * no endpoint of the models is listed for, or web searches or audio none of the tier's endpoints
 * gives a price for. Returns what the call asks for beyond tokens.
 */
function checkBilled(models: CatalogModel[], body: Body, operation: InferenceOperation, route: RouteAsked): PricedExtras {
  refuseUnpricedTools(body);
  const served = (keep: (e: Endpoint) => boolean) => models.some((m) => m.endpoints.some((e) => keep(e) && servesOperation(e, operation)));
  const names = models.map((m) => m.id).join(', ');
  const tier = tierOf(body, operation);
  if (tier && !served((e) => servesTier(e, { tier, optIn: [] }))) {
    const { field } = TIER_SETTINGS[operation]!;
    throw new BadRequestError(
      `${field}: "${tier}" is a provider tier billed away from the standard prices, and no endpoint of ${names} is listed for it at its own`,
    );
  }
  const ofTier = tier ? ` (${tier})` : '';
  // A search the web plugin asked for is named by the plugin, not the setting it became.
  const setting = searchField(body);
  const search = setting && (webPluginField(body, route.variant) ?? setting);
  const audio = audioFields(body);
  // Each extra is checked with those before it, so the 400 names the first the endpoints cannot all be priced for.
  const optIn = tier ? [] : tierOptIn(route.variant, route.preferences);
  const extras: PricedExtras = { tier, optIn, searches: false, audioIn: false, audioOut: false };
  for (const [field, key, what, price] of [
    [search, 'searches', 'web searches are billed by providers per search', 'a web_search'],
    [audio.input, 'audioIn', 'audio sent is billed by providers at its own prices', 'an audio'],
    [audio.output, 'audioOut', 'audio asked for is billed by providers at its own prices', 'an audio_completion'],
  ] as const) {
    if (!field) continue;
    extras[key] = true;
    if (!served((e) => servesExtras(e, extras)))
      throw new BadRequestError(`${field}: ${what}, and no endpoint of ${names}${ofTier} has ${price} price in the catalog`);
  }
  return extras;
}

export function planInference(catalog: Catalog, requested: Body, operation: InferenceOperation): InferencePlan {
  const names = modelNamesOf(requested);
  const primary = catalog.resolve(names[0]);
  const models = [primary.model];
  for (const name of names.slice(1)) {
    const m = catalog.resolve(name).model;
    if (!models.includes(m)) models.push(m);
  }
  if (operation === 'messages' && !Number.isInteger(requested.max_tokens)) {
    throw new BadRequestError('max_tokens: is required (in the request or its preset)');
  }

  const { body, extras } = billedRequest(models, requested, operation, {
    variant: primary.variant,
    preferences: requested.provider ?? undefined,
  });
  const upstreamBody = upstreamBodyOf(body);
  const maxOut = body.max_completion_tokens ?? body.max_tokens ?? body.max_output_tokens;
  return {
    models,
    variant: primary.variant,
    preferences: body.provider ?? undefined,
    upstreamBody,
    parameters: Object.keys(upstreamBody).filter((k) => !CONTENT_FIELDS.has(k)),
    stream: body.stream === true,
    includeUsage: body.stream_options?.include_usage === true || body.usage?.include === true,
    maxOutputTokens: Number.isInteger(maxOut) ? maxOut : null,
    choices: operation === 'chat' && Number.isInteger(body.n) && body.n > 1 ? body.n : 1,
    extras,
    notRun: pluginsNotRun(body),
  };
}
