// The routing engine: a pure function from (models, preferences, workspace settings, live stats)
// to the ordered list of endpoints to try. No I/O; randomness and time are inputs.
import { createHash } from 'node:crypto';
import type { CatalogModel, Endpoint, ModelVariant, Operation } from '../catalog';
import type { ProviderPreferences } from './preferences';
import { NotFoundError } from '../../infrastructure/errors';
import { translationFor } from '../../infrastructure/providers/translate';

export type Percentile = 'p50' | 'p75' | 'p90' | 'p99';
export type Percentiles = Partial<Record<Percentile, number>>;

export interface EndpointStat {
  /** Seconds. */
  latency: Percentiles | null;
  /** Output tokens per second. */
  throughput: Percentiles | null;
  requests: number;
  failures: number;
  /** Unix ms of the latest failure, if any in the window. */
  lastFailureAt: number | null;
}

export type StatsSnapshot = ReadonlyMap<string, EndpointStat>;

export interface RouteInput {
  /** The requested model first, then any fallback models, in order. */
  models: CatalogModel[];
  operation: Operation;
  preferences?: ProviderPreferences;
  workspace?: { only?: string[]; ignore?: string[] };
  stats?: StatsSnapshot;
  /** Names of the parameters the request supplies, for `require_parameters`. */
  parameters?: string[];
  variant?: ModelVariant;
  /** What the call asks for that a provider bills beyond tokens (checkBilled): only endpoints priced for it serve it. */
  extras?: PricedExtras;
  /**
   * A sticky-routing key (the workspace's session id): where the router may choose, calls with one
   * key go to the same endpoint while it is healthy, in every process, and move together when not.
   */
  session?: string;
  now: number;
  random: () => number;
}

export interface RoutePlan {
  endpoints: Endpoint[];
  allowFallbacks: boolean;
}

/** Endpoints with a failure this recent count as having an outage and go last. */
export const OUTAGE_WINDOW_MS = 30_000;

/** A base slug (`sandbox-alpha`) matches all of that provider's endpoints; a full tag only its own. */
function matchesSlug(slug: string, e: Endpoint): boolean {
  return slug === e.tag || slug === e.provider.slug;
}

/** Cost of a typical call (1,000 prompt and 250 completion tokens), the price the sorts compare. */
export function typicalPrice(e: Endpoint): number {
  const p = e.entry.pricing;
  return (p.prompt * 1000 + p.completion * 250) / 1e6 + (p.request ?? 0);
}

/** Which kinds of model an operation applies to: logprob decisions run on chat completions. */
const OPERATION_KINDS: Record<Operation, readonly string[]> = {
  chat: ['chat', 'decision'],
  responses: ['chat'],
  messages: ['chat'],
  embeddings: ['embedding'],
  systemone: ['decision'],
};

/**
 * Whether the endpoint can serve the operation: natively, or (chat models only: a decision's
 * logprobs do not survive translation) through its provider format's translation.
 */
export function servesOperation(e: Endpoint, operation: Operation): boolean {
  if (!OPERATION_KINDS[operation].includes(e.model.kind)) return false;
  return e.operations.includes(operation) || (e.model.kind === 'chat' && Boolean(translationFor(e.provider.adapter, operation)));
}

/**
 * What a call asks a provider for that it bills beyond the catalog's token prices: a provider tier
 * (null: the standard one), web searches, audio heard and spoken. Such a call goes only to
 * endpoints the catalog prices for it, so it is never billed at prices below the provider's.
 */
export interface PricedExtras {
  tier: string | null;
  /**
   * Tiers, and endpoint tags, that may serve the call though it asks for no tier (OpenRouter's
   * opt-ins: `:nitro` lets priority endpoints compete, `:floor` flex ones, and a full tag in
   * `provider.only` or `order` names one); such an endpoint is sent its tier's request fields.
   */
  optIn: readonly string[];
  searches: boolean;
  audioIn: boolean;
  audioOut: boolean;
}

/**
 * Whether the endpoint may serve the call's tier: the tier asked for, only by its endpoints; none,
 * by endpoints of no tier and those the call opts in.
 */
export function servesTier(e: Endpoint, extras: Pick<PricedExtras, 'tier' | 'optIn'> | undefined): boolean {
  const tier = e.entry.service_tier ?? null;
  if (extras?.tier) return tier === extras.tier;
  return tier === null || Boolean(extras?.optIn.includes(tier) || extras?.optIn.includes(e.tag));
}

/** Tiers a variant lets compete with the standard endpoints (OpenRouter's `:nitro` and `:floor`). */
const VARIANT_TIERS: Partial<Record<NonNullable<ModelVariant>, string[]>> = { nitro: ['priority', 'fast'], floor: ['flex'] };

/** What a call opts in to without asking for a tier: its variant's tiers, and endpoints its `only` or `order` name by full tag. */
export function tierOptIn(variant: ModelVariant, preferences: ProviderPreferences | undefined): string[] {
  const tags = [...(preferences?.only ?? []), ...(preferences?.order ?? [])].filter((s) => typeof s === 'string' && s.includes('/'));
  return [...((variant && VARIANT_TIERS[variant]) ?? []), ...tags];
}

/** Whether the catalog gives the endpoint a price for each extra the call asks for besides a tier. */
function pricesExtras(e: Endpoint, extras: PricedExtras | undefined): boolean {
  const p = e.entry.pricing;
  return (
    (!extras?.searches || p.web_search !== undefined) &&
    (!extras?.audioIn || p.audio !== undefined) &&
    (!extras?.audioOut || p.audio_completion !== undefined)
  );
}

/** Whether the catalog prices the endpoint for the call's extras: its tier (and only that one), and each other extra it asks for. */
export function servesExtras(e: Endpoint, extras: PricedExtras | undefined): boolean {
  return servesTier(e, extras) && pricesExtras(e, extras);
}

type Filter = [name: string, keep: (e: Endpoint) => boolean];

function filters(input: RouteInput): Filter[] {
  const prefs = input.preferences ?? {};
  const ws = input.workspace ?? {};
  // An endpoint of a tier serves the calls that ask for it, or opt in to it, at its prices, and only those.
  const out: Filter[] = [['service_tier', (e) => servesTier(e, input.extras)]];
  // A call that may run web searches, or sends or asks for audio, goes only where the catalog gives their prices.
  const x = input.extras;
  if (x?.searches || x?.audioIn || x?.audioOut) out.push(['priced_extras', (e) => pricesExtras(e, x)]);
  // `only` lists are ceilings: an endpoint must be allowed by every list that is given.
  const onlyLists = [prefs.only, ws.only].filter((l): l is string[] => Array.isArray(l));
  if (onlyLists.length) out.push(['only', (e) => onlyLists.every((l) => l.some((s) => matchesSlug(s, e)))]);
  const ignore = [...(prefs.ignore ?? []), ...(ws.ignore ?? [])];
  if (ignore.length) out.push(['ignore', (e) => !ignore.some((s) => matchesSlug(s, e))]);
  if (prefs.quantizations?.length) out.push(['quantizations', (e) => prefs.quantizations!.includes(e.entry.quantization)]);
  if (prefs.data_collection === 'deny') out.push(['data_collection', (e) => !e.provider.collects_data]);
  if (prefs.zdr === true) out.push(['zdr', (e) => e.provider.zdr]);
  if (prefs.enforce_distillable_text === true) out.push(['enforce_distillable_text', (e) => e.model.distillable]);
  const caps = prefs.max_price;
  if (caps && Object.keys(caps).length) {
    out.push([
      'max_price',
      (e) => {
        const p = e.entry.pricing;
        const over = (cap: string | undefined, price: number | undefined) =>
          cap !== undefined && price !== undefined && price > Number(cap);
        return (
          !over(caps.prompt, p.prompt) &&
          !over(caps.completion, p.completion) &&
          !over(caps.request, p.request ?? 0) &&
          !over(caps.image, p.image) &&
          !over(caps.audio, p.audio)
        );
      },
    ]);
  }
  if (prefs.require_parameters === true && input.parameters?.length) {
    out.push(['require_parameters', (e) => input.parameters!.every((p) => e.entry.supported_parameters.includes(p))]);
  }
  return out;
}

function sortSetting(input: RouteInput): { by: string | null; partition: 'model' | 'none' } {
  const sort = input.preferences?.sort;
  let by: string | null = typeof sort === 'string' ? sort : (sort?.by ?? null);
  const partition = (typeof sort === 'object' && sort?.partition) || 'model';
  // `:nitro` and `:floor` are shortcuts for throughput and price sorting; an explicit sort wins.
  if (!by && input.variant === 'nitro') by = 'throughput';
  if (!by && input.variant === 'floor') by = 'price';
  return { by, partition };
}

function sortKey(by: string, stats: StatsSnapshot): (a: Endpoint, b: Endpoint) => number {
  const price = (a: Endpoint, b: Endpoint) => typicalPrice(a) - typicalPrice(b);
  const stat = (e: Endpoint) => stats.get(e.key);
  const p50 = (e: Endpoint, what: 'latency' | 'throughput') => stat(e)?.[what]?.p50;
  const uptime = (e: Endpoint) => {
    const s = stat(e);
    return s && s.requests + s.failures > 0 ? s.requests / (s.requests + s.failures) : 1;
  };
  switch (by) {
    case 'latency': // unknown latency sorts after every measured one
      return (a, b) => (p50(a, 'latency') ?? Infinity) - (p50(b, 'latency') ?? Infinity) || price(a, b);
    case 'throughput':
      return (a, b) => (p50(b, 'throughput') ?? -1) - (p50(a, 'throughput') ?? -1) || price(a, b);
    case 'exacto': // quality: reliability first, then speed, then price
      return (a, b) => uptime(b) - uptime(a) || (p50(b, 'throughput') ?? -1) - (p50(a, 'throughput') ?? -1) || price(a, b);
    default:
      return price;
  }
}

/** The price weight of the default load balancing: cheaper endpoints are drawn more often. */
const weightOf = (e: Endpoint) => 1 / Math.max(typicalPrice(e), 1e-9) ** 2;

/**
 * Weighted rendezvous hashing: each endpoint scores `weight / -ln(u)`, `u` a hash of the session and
 * the endpoint in (0, 1). The highest score wins; the same key ranks the same endpoints the same way
 * in every process, with no state; sessions spread over endpoints in proportion to their weights;
 * and an endpoint leaving the list moves only the sessions it had, each to its own next choice.
 */
function rendezvousOrder(group: Endpoint[], session: string): Endpoint[] {
  const score = (e: Endpoint) => {
    const u = (createHash('sha1').update(session).update('\0').update(e.key).digest().readUIntBE(0, 6) + 1) / (2 ** 48 + 1);
    return weightOf(e) / -Math.log(u);
  };
  return group
    .map((e) => ({ e, s: score(e) }))
    .sort((a, b) => b.s - a.s)
    .map((x) => x.e);
}

/**
 * Default load balancing: endpoints without a recent outage first, the first of them drawn at
 * random weighted by 1/price², the other stable ones by price, then the unstable ones by price.
 * With a session key, both parts are in the session's rendezvous order instead.
 */
function loadBalance(group: Endpoint[], input: RouteInput): Endpoint[] {
  const stats = input.stats ?? new Map();
  const outage = (e: Endpoint) => {
    const t = stats.get(e.key)?.lastFailureAt;
    return t !== null && t !== undefined && input.now - t < OUTAGE_WINDOW_MS;
  };
  const byPrice = (a: Endpoint, b: Endpoint) => typicalPrice(a) - typicalPrice(b);
  if (input.session)
    return [
      ...rendezvousOrder(
        group.filter((e) => !outage(e)),
        input.session,
      ),
      ...rendezvousOrder(group.filter(outage), input.session),
    ];
  const stable = group.filter((e) => !outage(e)).sort(byPrice);
  const unstable = group.filter(outage).sort(byPrice);
  if (stable.length > 1) {
    const weights = stable.map(weightOf);
    let r = input.random() * weights.reduce((a, b) => a + b, 0);
    let pick = stable.length - 1;
    for (let i = 0; i < weights.length; i++) {
      r -= weights[i];
      if (r < 0) {
        pick = i;
        break;
      }
    }
    stable.unshift(...stable.splice(pick, 1));
  }
  return [...stable, ...unstable];
}

function meetsCutoffs(e: Endpoint, input: RouteInput): boolean {
  const prefs = input.preferences ?? {};
  const s = input.stats?.get(e.key);
  const check = (
    pref: number | Percentiles | null | undefined,
    measured: Percentiles | null | undefined,
    ok: (m: number, c: number) => boolean,
  ) => {
    if (pref === null || pref === undefined) return true;
    const cutoffs: Percentiles = typeof pref === 'number' ? { p50: pref } : pref;
    return (Object.entries(cutoffs) as [Percentile, number | null][]).every(
      ([p, c]) => c === null || measured?.[p] === undefined || ok(measured[p]!, c),
    );
  };
  return (
    check(prefs.preferred_max_latency as Percentiles | number | null | undefined, s?.latency, (m, c) => m <= c) &&
    check(prefs.preferred_min_throughput as Percentiles | number | null | undefined, s?.throughput, (m, c) => m >= c)
  );
}

function groupByModel(endpoints: Endpoint[], models: CatalogModel[]): Endpoint[][] {
  return models.map((m) => endpoints.filter((e) => e.model === m)).filter((g) => g.length > 0);
}

export function planRoute(input: RouteInput): RoutePlan {
  const prefs = input.preferences ?? {};
  // Named only in a refusal: most calls are not refused.
  const names = () => input.models.map((m) => m.id).join(', ');
  let candidates = input.models.flatMap((m) => m.endpoints).filter((e) => servesOperation(e, input.operation));
  if (!candidates.length) {
    throw new NotFoundError(`No endpoint of ${names()} serves ${input.operation}`, { model: names(), operation: input.operation });
  }
  for (const [name, keep] of filters(input)) {
    candidates = candidates.filter(keep);
    if (!candidates.length) {
      throw new NotFoundError(`No endpoint of ${names()} satisfies provider.${name}`, { model: names(), preference: `provider.${name}` });
    }
  }

  const allowFallbacks = prefs.allow_fallbacks !== false;
  const { by, partition } = sortSetting(input);
  const stats = input.stats ?? new Map<string, EndpointStat>();
  const cutoffs = prefs.preferred_max_latency != null || prefs.preferred_min_throughput != null;
  const orderAll = (list: Endpoint[]): Endpoint[] => {
    const groups = partition === 'none' ? [list] : groupByModel(list, input.models);
    return groups.flatMap((g) => {
      // One endpoint has no order to choose (the common case of a model served once).
      const ordered = g.length === 1 ? g : by ? [...g].sort(sortKey(by, stats)) : loadBalance(g, input);
      if (!cutoffs) return ordered;
      // Preferred latency/throughput cutoffs move misses to the back; they never remove anything.
      return [...ordered.filter((e) => meetsCutoffs(e, input)), ...ordered.filter((e) => !meetsCutoffs(e, input))];
    });
  };

  let endpoints: Endpoint[];
  if (prefs.order?.length) {
    const ordered: Endpoint[] = [];
    for (const slug of prefs.order) for (const e of candidates) if (matchesSlug(slug, e) && !ordered.includes(e)) ordered.push(e);
    if (!allowFallbacks) {
      if (!ordered.length)
        throw new NotFoundError(`No endpoint of ${names()} is in provider.order`, { model: names(), preference: 'provider.order' });
      endpoints = ordered;
    } else {
      endpoints = [...ordered, ...orderAll(candidates.filter((e) => !ordered.includes(e)))];
    }
  } else {
    endpoints = orderAll(candidates);
    if (!allowFallbacks) endpoints = endpoints.slice(0, 1);
  }
  return { endpoints, allowFallbacks };
}

/** `provider.options.<slug>` for the endpoint actually called, limited to keys its provider accepts. */
export function optionsFor(e: Endpoint, prefs: ProviderPreferences | undefined): Record<string, unknown> {
  const given = prefs?.options?.[e.tag] ?? prefs?.options?.[e.provider.slug];
  if (!given) return {};
  const accepted = new Set(e.provider.accepted_options ?? []);
  return Object.fromEntries(Object.entries(given).filter(([k]) => accepted.has(k)));
}
