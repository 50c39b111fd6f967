// The routing engine, field by field and in combination, on a small inline catalog.
import { expect } from 'chai';
import { Type } from '@sinclair/typebox';
import { Catalog, CatalogError } from '../../domain/catalog';
import { optionsFor, planRoute, typicalPrice, type EndpointStat, type RouteInput } from '../../domain/routing/engine';
import { failureToError } from '../../domain/routing/execute';
import { UpstreamFailure } from '../../infrastructure/providers/failure';
import { ProviderPreferences } from '../../domain/routing/preferences';
import { compileBody } from '../../infrastructure/validation/index';
import { NotFoundError } from '../../infrastructure/errors';

const provider = (slug: string, extra: Record<string, unknown> = {}) => ({
  slug,
  name: slug,
  adapter: 'openai',
  base_url: 'http://127.0.0.1:1/v1',
  collects_data: false,
  zdr: false,
  max_concurrency: 10,
  timeout_ms: 1000,
  ...extra,
});
const endpoint = (p: string, prompt: number, extra: Record<string, unknown> = {}) => ({
  provider: p,
  upstream_model: 'u',
  pricing: { prompt, completion: prompt },
  quantization: 'bf16',
  supported_parameters: ['temperature'],
  ...extra,
});

export const testCatalog = Catalog.fromObject({
  providers: [
    provider('alpha', { collects_data: true, accepted_options: ['seed'] }),
    provider('beta', { zdr: true }),
    provider('delta', { collects_data: true }),
    provider('claude', { adapter: 'anthropic' }),
  ],
  models: [
    {
      id: 'acme/chat-2',
      name: 'Chat 2',
      kind: 'chat',
      family: 'acme/chat',
      version: '2',
      released: '20260101',
      context_length: 1000,
      distillable: true,
      aliases: ['chat-two'],
      endpoints: [
        endpoint('alpha', 1, { quantization: 'fp8', supported_parameters: ['temperature', 'tools'] }),
        endpoint('alpha', 0.5, { variant: 'turbo', quantization: 'fp4' }),
        endpoint('beta', 2, { supported_parameters: ['temperature', 'tools'] }),
        endpoint('delta', 3, { quantization: 'int8', pricing: { prompt: 3, completion: 3, request: 0.01 } }),
      ],
    },
    {
      id: 'acme/chat-1',
      name: 'Chat 1',
      kind: 'chat',
      family: 'acme/chat',
      version: '1',
      released: '20250101',
      context_length: 1000,
      distillable: false,
      endpoints: [endpoint('beta', 0.2, { quantization: 'fp16' })],
    },
    {
      id: 'acme/mixed',
      name: 'Mixed formats',
      kind: 'chat',
      family: 'acme/mixed',
      version: '1',
      released: '20260101',
      context_length: 1000,
      distillable: true,
      endpoints: [endpoint('alpha', 1), endpoint('claude', 1.5)],
    },
    {
      id: 'acme/decide',
      name: 'Decisions on chat endpoints',
      kind: 'decision',
      family: 'acme/decide',
      version: '1',
      released: '20260101',
      context_length: 1000,
      distillable: true,
      endpoints: [endpoint('alpha', 1), endpoint('claude', 1.5)],
    },
  ],
});

const [chat2, chat1, mixed, decide] = testCatalog.models;
const tags = (input: Partial<RouteInput>) =>
  planRoute({ models: [chat2], operation: 'chat', now: 1_000_000, random: () => 0, ...input }).endpoints.map(
    (e) => `${e.model.id === 'acme/chat-1' ? 'c1:' : ''}${e.tag}`,
  );
const stat = (s: Partial<EndpointStat>): EndpointStat => ({
  latency: null,
  throughput: null,
  requests: 10,
  failures: 0,
  lastFailureAt: null,
  ...s,
});
const notFound = (input: Partial<RouteInput>) => {
  try {
    tags(input);
  } catch (err) {
    expect(err).to.be.instanceOf(NotFoundError);
    return (err as NotFoundError).message;
  }
  throw new Error('expected a 404');
};

describe('routing engine', () => {
  it('by default puts the cheapest first when the draw says so, then the rest by price', () => {
    expect(tags({})).to.deep.equal(['alpha/turbo', 'alpha', 'beta', 'delta']);
  });

  it('draws the first endpoint with weight 1/price²', () => {
    let seed = 1;
    const random = () => (seed = (seed * 16807) % 2147483647) / 2147483647;
    const counts = new Map<string, number>();
    for (let i = 0; i < 20000; i++) {
      const first = planRoute({ models: [chat2], operation: 'chat', now: 0, random, preferences: { only: ['alpha', 'beta'] } }).endpoints[0]
        .tag;
      counts.set(first, (counts.get(first) ?? 0) + 1);
    }
    const [turbo, alpha, beta] = ['alpha/turbo', 'alpha', 'beta'].map((t) => testCatalog.models[0].endpoints.find((e) => e.tag === t)!);
    const w = [turbo, alpha, beta].map((e) => 1 / typicalPrice(e) ** 2);
    const total = w.reduce((a, b) => a + b);
    expect(counts.get('alpha/turbo')! / 20000).to.be.closeTo(w[0] / total, 0.02);
    expect(counts.get('beta')! / 20000).to.be.closeTo(w[2] / total, 0.01);
  });

  describe('sticky sessions', () => {
    const draws = [() => 0, () => 0.5, () => 0.999];
    const route = (session: string, extra: Partial<RouteInput> = {}) =>
      draws.map((random) => tags({ session, random, preferences: { only: ['alpha', 'beta', 'delta'] }, ...extra }));

    it('one session gets one order, whatever the draw, and other sessions spread by price weight', () => {
      for (const session of ['s1', 's2', 'ws-a\nchat-42']) {
        const [first, ...rest] = route(session);
        for (const r of rest) expect(r).to.deep.equal(first);
      }
      const firsts = new Map<string, number>();
      for (let i = 0; i < 4000; i++) {
        const first = tags({ session: `session-${i}`, preferences: { only: ['alpha', 'beta'] } })[0];
        firsts.set(first, (firsts.get(first) ?? 0) + 1);
      }
      const [turbo, alpha, beta] = ['alpha/turbo', 'alpha', 'beta'].map((t) => chat2.endpoints.find((e) => e.tag === t)!);
      const w = [turbo, alpha, beta].map((e) => 1 / typicalPrice(e) ** 2);
      const total = w.reduce((x, y) => x + y, 0);
      ['alpha/turbo', 'alpha', 'beta'].forEach((t, i) => expect((firsts.get(t) ?? 0) / 4000, t).to.be.closeTo(w[i] / total, 0.03));
    });

    it("an endpoint with an outage or filtered out moves its sessions to each one's next choice, the same in every process", () => {
      for (const session of Array.from({ length: 50 }, (_, i) => `s-${i}`)) {
        const order = route(session)[0];
        const down = stat({ lastFailureAt: 1_000_000 - 1000 });
        const failed = tags({
          session,
          stats: new Map([[`acme/chat-2@${order[0]}`, down]]),
          preferences: { only: ['alpha', 'beta', 'delta'] },
        });
        expect(failed).to.deep.equal([...order.slice(1), order[0]]);
        const without = tags({ session, preferences: { only: ['alpha', 'beta', 'delta'], ignore: [order[0]] } });
        expect(without).to.deep.equal(order.slice(1).filter((t) => !t.startsWith(`${order[0]}/`)));
      }
    });

    it('explicit order and sort preferences win over the session', () => {
      expect(tags({ session: 's1', preferences: { sort: 'price' } })).to.deep.equal(tags({ preferences: { sort: 'price' } }));
      expect(tags({ session: 's1', preferences: { order: ['delta'] } })[0]).to.equal('delta');
    });
  });

  it('moves endpoints with an outage in the last 30 s to the back', () => {
    const stats = new Map([
      ['acme/chat-2@alpha/turbo', stat({ lastFailureAt: 1_000_000 - 5_000 })],
      ['acme/chat-2@alpha', stat({ lastFailureAt: 1_000_000 - 60_000 })],
    ]);
    expect(tags({ stats })).to.deep.equal(['alpha', 'beta', 'delta', 'alpha/turbo']);
  });

  const filterCases: [string, Partial<RouteInput>, string[]][] = [
    ['only: a base slug matches every variant', { preferences: { only: ['alpha'] } }, ['alpha/turbo', 'alpha']],
    ['only: a full tag matches one endpoint', { preferences: { only: ['alpha/turbo'] } }, ['alpha/turbo']],
    [
      'only is a ceiling with the workspace list',
      { preferences: { only: ['alpha', 'beta'] }, workspace: { only: ['beta', 'delta'] } },
      ['beta'],
    ],
    ['ignore', { preferences: { ignore: ['alpha'] } }, ['beta', 'delta']],
    [
      'ignore merges with the workspace list',
      { preferences: { ignore: ['alpha/turbo'] }, workspace: { ignore: ['delta'] } },
      ['alpha', 'beta'],
    ],
    ['quantizations', { preferences: { quantizations: ['bf16', 'int8'] } }, ['beta', 'delta']],
    ['data_collection: deny', { preferences: { data_collection: 'deny' } }, ['beta']],
    ['data_collection: allow keeps all', { preferences: { data_collection: 'allow' } }, ['alpha/turbo', 'alpha', 'beta', 'delta']],
    ['zdr', { preferences: { zdr: true } }, ['beta']],
    [
      'enforce_distillable_text on a distillable model',
      { preferences: { enforce_distillable_text: true } },
      ['alpha/turbo', 'alpha', 'beta', 'delta'],
    ],
    ['max_price prompt', { preferences: { max_price: { prompt: '1' } } }, ['alpha/turbo', 'alpha']],
    ['max_price request', { preferences: { max_price: { request: '0.001' } } }, ['alpha/turbo', 'alpha', 'beta']],
    ['require_parameters', { preferences: { require_parameters: true }, parameters: ['tools'] }, ['alpha', 'beta']],
    [
      'require_parameters off ignores unsupported parameters',
      { preferences: { require_parameters: false }, parameters: ['tools'] },
      ['alpha/turbo', 'alpha', 'beta', 'delta'],
    ],
    ['order, then the rest', { preferences: { order: ['delta', 'beta'] } }, ['delta', 'beta', 'alpha/turbo', 'alpha']],
    [
      'order without fallbacks uses only the ordered providers',
      { preferences: { order: ['beta', 'alpha'], allow_fallbacks: false } },
      ['beta', 'alpha', 'alpha/turbo'],
    ],
    ['no fallbacks without order: the primary only', { preferences: { allow_fallbacks: false } }, ['alpha/turbo']],
    ['sort price', { preferences: { sort: 'price' } }, ['alpha/turbo', 'alpha', 'beta', 'delta']],
    [
      'filters combine',
      { preferences: { data_collection: 'deny', quantizations: ['bf16'], max_price: { completion: '5' }, zdr: true } },
      ['beta'],
    ],
    [
      'only + order + sort together: order wins, sort orders the rest',
      { preferences: { only: ['alpha', 'delta'], order: ['delta'], sort: 'price' } },
      ['delta', 'alpha/turbo', 'alpha'],
    ],
    [':floor sorts by price', { variant: 'floor' }, ['alpha/turbo', 'alpha', 'beta', 'delta']],
    ['operation: every chat endpoint, whatever its format', { models: [mixed], operation: 'messages' }, ['alpha', 'claude']],
    ['operation: and through every chat API', { models: [mixed], operation: 'chat' }, ['alpha', 'claude']],
    ['operation: a decision model only natively (logprobs do not survive translation)', { models: [decide], operation: 'chat' }, ['alpha']],
  ];
  for (const [name, input, expected] of filterCases) {
    it(name, () => expect(tags(input)).to.deep.equal(expected));
  }

  const exclusionCases: [string, Partial<RouteInput>, string][] = [
    ['only', { preferences: { only: ['nobody'] } }, 'provider.only'],
    ['disjoint only lists', { preferences: { only: ['alpha'] }, workspace: { only: ['beta'] } }, 'provider.only'],
    ['ignore', { preferences: { ignore: ['alpha', 'beta', 'delta'] } }, 'provider.ignore'],
    ['quantizations', { preferences: { quantizations: ['int4'] } }, 'provider.quantizations'],
    ['zdr with data_collection', { preferences: { data_collection: 'deny', only: ['alpha', 'delta'] } }, 'provider.data_collection'],
    ['max_price', { preferences: { max_price: { completion: '0.1' } } }, 'provider.max_price'],
    ['require_parameters', { preferences: { require_parameters: true }, parameters: ['response_format'] }, 'provider.require_parameters'],
    ['order without fallbacks', { preferences: { order: ['nobody'], allow_fallbacks: false } }, 'provider.order'],
    ['enforce_distillable_text', { models: [chat1], preferences: { enforce_distillable_text: true } }, 'provider.enforce_distillable_text'],
  ];
  for (const [name, input, pref] of exclusionCases) {
    it(`404 naming ${pref} when ${name} excludes everything`, () => expect(notFound(input)).to.include(pref));
  }

  it('404 naming the operation when no endpoint serves it', () => {
    expect(notFound({ operation: 'embeddings' })).to.equal('No endpoint of acme/chat-2 serves embeddings');
  });

  it('sort: latency and throughput use live percentiles, unknown last', () => {
    const stats = new Map([
      ['acme/chat-2@alpha', stat({ latency: { p50: 0.9 }, throughput: { p50: 50 } })],
      ['acme/chat-2@beta', stat({ latency: { p50: 0.2 }, throughput: { p50: 20 } })],
      ['acme/chat-2@delta', stat({ latency: { p50: 0.5 }, throughput: { p50: 90 } })],
    ]);
    expect(tags({ stats, preferences: { sort: 'latency' } })).to.deep.equal(['beta', 'delta', 'alpha', 'alpha/turbo']);
    expect(tags({ stats, preferences: { sort: { by: 'throughput' } } })).to.deep.equal(['delta', 'alpha', 'beta', 'alpha/turbo']);
    expect(tags({ stats, variant: 'nitro' })).to.deep.equal(['delta', 'alpha', 'beta', 'alpha/turbo']);
    const flaky = new Map([...stats, ['acme/chat-2@delta', stat({ requests: 5, failures: 5, throughput: { p50: 90 } })]]);
    expect(tags({ stats: flaky, preferences: { sort: 'exacto' } })[0]).to.equal('alpha');
  });

  it('sort partition: model keeps fallback models behind; none sorts across models', () => {
    const both = { models: [chat2, chat1], preferences: { sort: { by: 'price' as const, partition: 'model' as const } } };
    expect(tags(both)).to.deep.equal(['alpha/turbo', 'alpha', 'beta', 'delta', 'c1:beta']);
    expect(tags({ ...both, preferences: { sort: { by: 'price', partition: 'none' } } })).to.deep.equal([
      'c1:beta',
      'alpha/turbo',
      'alpha',
      'beta',
      'delta',
    ]);
  });

  it('preferred_max_latency and preferred_min_throughput deprioritize misses without removing them', () => {
    const stats = new Map([
      ['acme/chat-2@alpha/turbo', stat({ latency: { p50: 3, p90: 4 }, throughput: { p50: 10 } })],
      ['acme/chat-2@alpha', stat({ latency: { p50: 0.5, p90: 2 }, throughput: { p50: 100 } })],
    ]);
    expect(tags({ stats, preferences: { preferred_max_latency: 1 } })).to.deep.equal(['alpha', 'beta', 'delta', 'alpha/turbo']);
    expect(tags({ stats, preferences: { preferred_max_latency: { p90: 1.5 } } })).to.deep.equal(['beta', 'delta', 'alpha/turbo', 'alpha']);
    expect(tags({ stats, preferences: { preferred_min_throughput: { p50: 50, p99: null } } })).to.deep.equal([
      'alpha',
      'beta',
      'delta',
      'alpha/turbo',
    ]);
    expect(tags({ stats, preferences: { preferred_min_throughput: 50, preferred_max_latency: 1 } })).to.deep.equal([
      'alpha',
      'beta',
      'delta',
      'alpha/turbo',
    ]);
  });

  it('forwards provider.options only to the chosen provider, and only keys it accepts', () => {
    const [alpha, beta] = ['alpha', 'beta'].map((t) => chat2.endpoints.find((e) => e.tag === t)!);
    const prefs = { options: { alpha: { seed: 7, secret_flag: true }, beta: { seed: 9 } } };
    expect(optionsFor(alpha, prefs)).to.deep.equal({ seed: 7 });
    expect(optionsFor(beta, prefs)).to.deep.equal({}); // beta accepts no options
  });

  it('validates provider preferences: unknown keys and bad values are 400s naming the field', () => {
    const check = compileBody(Type.Object({ provider: ProviderPreferences }));
    const message = (body: unknown) => {
      try {
        check(body);
        return null;
      } catch (err) {
        return (err as Error).message;
      }
    };
    expect(
      message({
        provider: {
          only: ['a'],
          sort: { by: 'price', partition: 'none' },
          preferred_max_latency: { p90: 2 },
          max_price: { prompt: '1.5' },
        },
      }),
    ).to.equal(null);
    expect(message({ provider: null })).to.equal(null);
    expect(message({ provider: { fastest: true } })).to.equal('provider.fastest: is not an allowed field');
    expect(message({ provider: { sort: { by: 'price', order: 1 } } })).to.equal('provider.sort.order: is not an allowed field');
    expect(message({ provider: { quantizations: ['fp9'] } })).to.match(/^provider\.quantizations\[0\]: must be one of/);
    expect(message({ provider: { data_collection: 'maybe' } })).to.equal('provider.data_collection: must be one of "allow", "deny"');
    expect(message({ provider: { max_price: { prompt: 1 } } })).to.equal('provider.max_price.prompt: must be string');
  });
});

describe('upstream failure → status', () => {
  const cases: [UpstreamFailure, number][] = [
    [new UpstreamFailure('http', 'p', 'boom', 500), 502],
    [new UpstreamFailure('http', 'p', 'bad request', 400), 502],
    [new UpstreamFailure('connection', 'p', 'refused'), 502],
    [new UpstreamFailure('invalid_response', 'p', 'not JSON', 200), 502],
    [new UpstreamFailure('timeout', 'p', 'slow'), 524],
    [new UpstreamFailure('overloaded', 'p', 'busy', 529), 529],
    [new UpstreamFailure('capacity', 'p', 'full'), 503],
    [new UpstreamFailure('rate_limited', 'p', 'slow down', 429, 7000), 429],
  ];
  for (const [failure, status] of cases) {
    it(`${failure.kind}${failure.status ? ` ${failure.status}` : ''} → ${status}, naming the provider and what it said`, () => {
      const err = failureToError(failure, [
        { provider: 'p', endpoint: 'p', kind: failure.kind, status: failure.status, message: failure.message },
      ]);
      expect(err.status).to.equal(status);
      expect(err.metadata).to.include({ provider_name: 'p', upstream_status: failure.status, upstream_message: failure.message });
      if (status === 429) expect((err as unknown as { retryAfterSeconds: number }).retryAfterSeconds).to.equal(7);
    });
  }
});

describe('catalog', () => {
  it('resolves bare ids, -latest, ~ aliases, dated ids, aliases and variants', () => {
    const cat = Catalog.fromObject({
      providers: [provider('p')],
      models: [
        {
          id: 'typesafe/jev-1.13',
          name: 'j',
          kind: 'decision',
          family: 'typesafe/jev',
          version: '1.13',
          released: '20260917',
          context_length: 1,
          distillable: false,
          endpoints: [endpoint('p', 1)],
        },
        {
          id: 'typesafe/jev-1.9',
          name: 'j',
          kind: 'decision',
          family: 'typesafe/jev',
          version: '1.9',
          released: '20250101',
          context_length: 1,
          distillable: false,
          endpoints: [endpoint('p', 1)],
        },
      ],
    });
    const r = (id: string) => cat.resolve(id).model.canonicalId;
    expect(r('jev-1.13')).to.equal('typesafe/jev-1.13-20260917');
    expect(r('jev-latest')).to.equal('typesafe/jev-1.13-20260917'); // 1.13 > 1.9 numerically
    expect(r('~typesafe/jev-latest')).to.equal('typesafe/jev-1.13-20260917');
    expect(r('typesafe/jev-1.9-20250101')).to.equal('typesafe/jev-1.9-20250101');
    expect(r('jev-1.9')).to.equal('typesafe/jev-1.9-20250101');
    expect(cat.resolve('jev-1.13:nitro').variant).to.equal('nitro');
    expect(testCatalog.resolve('chat-two').model.id).to.equal('acme/chat-2');
    for (const bad of ['jev-2.0', 'other/jev-latest', 'typesafe/jev-1.13-20990101', '']) {
      expect(() => cat.resolve(bad)).to.throw(NotFoundError, 'not found');
    }
  });

  const broken: [string, (c: any) => void, string][] = [
    [
      'an unknown endpoint provider',
      (c) => {
        c.models[0].endpoints[0].provider = 'ghost';
      },
      'models[0] (acme/chat-2).endpoints[0].provider: unknown provider "ghost"',
    ],
    [
      'a provider tier its provider’s format does not have',
      (c) => {
        c.models[0].endpoints[0].service_tier = 'turbo';
      },
      'models[0] (acme/chat-2).endpoints[0].service_tier: openai providers have no tier "turbo" (they have: priority, flex)',
    ],
    [
      'a duplicate provider slug',
      (c) => {
        c.providers.push({ ...c.providers[0] });
      },
      'providers[4] (alpha): duplicate provider slug',
    ],
    [
      'a bad quantization',
      (c) => {
        c.models[1].endpoints[0].quantization = 'fp9';
      },
      'models[1].endpoints[0].quantization: must be one of',
    ],
    [
      'a missing field',
      (c) => {
        delete c.providers[1].timeout_ms;
      },
      'providers[1].timeout_ms: is required',
    ],
    [
      'an unset URL variable',
      (c) => {
        c.providers[0].base_url = '${NOT_SET_ANYWHERE}/v1';
      },
      'providers[0] (alpha).base_url: environment variable NOT_SET_ANYWHERE is not set',
    ],
    [
      'an alias that collides',
      (c) => {
        c.models[1].aliases = ['chat-two'];
      },
      'models[1] (acme/chat-1): id or alias "chat-two" is also used by acme/chat-2',
    ],
  ];
  for (const [what, mutate, message] of broken) {
    it(`refuses ${what} with a message naming the entry`, () => {
      const raw = JSON.parse(
        JSON.stringify({
          providers: [...testCatalog.providers.values()].map((p) => ({ ...p })),
          models: testCatalog.models.map((m) => ({
            id: m.id,
            name: m.name,
            kind: m.kind,
            family: m.family,
            version: m.version,
            released: m.released,
            context_length: m.context_length,
            distillable: m.distillable,
            aliases: m.aliases,
            endpoints: m.endpoints.map((e) => e.entry),
          })),
        }),
      );
      mutate(raw);
      expect(() => Catalog.fromObject(raw, {})).to.throw(CatalogError, message);
    });
  }
});
