// Property-based fuzzing of every route, generated from the OpenAPI document (itself the TypeBox
// schemas that validate requests), then broken on purpose: wrong types, missing and extra fields,
// hostile keys and strings, deep nesting, huge numbers, invalid UTF-8, duplicate keys, wrong
// content types and methods, hostile path ids and queries. Every answer must be a 2xx/3xx or a 4xx
// in the error envelope, within a deadline; nothing a refused request touched is left half-written.
//
// FUZZ_RUNS sets the number of cases (default 3000). A failure prints fast-check's seed and path;
// replay it with FUZZ_SEED=<seed> FUZZ_PATH=<path> npm test.
import { expect } from 'chai';
import fc from 'fast-check';
import zlib from 'node:zlib';
import { fromSchema, hostileKey, hostileSegment, hostileString, wrongValue } from './fuzz/arbitraries';
import { batchesWithoutDocument, createTenant, startTestGateway, type Tenant, type TestGateway } from './helpers';

type Json = Record<string, any>;

interface Operation {
  method: string;
  /** OpenAPI path, `{name}` for parameters. */
  path: string;
  params: { name: string; in: 'path' | 'query'; required: boolean; schema: Json }[];
  body: Json | null;
  management: boolean;
  auth: boolean;
}

interface Case {
  op: Operation;
  method: string;
  url: string;
  headers: Record<string, string>;
  body: Uint8Array | null;
  what: string;
}

function operations(doc: Json): Operation[] {
  const ops: Operation[] = [];
  for (const [path, methods] of Object.entries<Json>(doc.paths)) {
    for (const [method, op] of Object.entries<Json>(methods)) {
      ops.push({
        method: method.toUpperCase(),
        path,
        params: op.parameters ?? [],
        body: op.requestBody?.content?.['application/json']?.schema ?? null,
        management: '403' in op.responses,
        auth: !(Array.isArray(op.security) && op.security.length === 0),
      });
    }
  }
  return ops;
}

/** Sets `value` at a random existing path of `obj` (or at the top), returning a copy. */
function setSomewhere(obj: unknown, pick: number, value: unknown): unknown {
  const paths: (string | number)[][] = [[]];
  const walk = (v: unknown, p: (string | number)[]) => {
    if (p.length > 5) return;
    if (Array.isArray(v))
      v.forEach((x, i) => {
        paths.push([...p, i]);
        walk(x, [...p, i]);
      });
    else if (v && typeof v === 'object')
      for (const [k, x] of Object.entries(v)) {
        paths.push([...p, k]);
        walk(x, [...p, k]);
      }
  };
  walk(obj, []);
  const target = paths[pick % paths.length];
  if (!target.length) return value;
  const copy = structuredClone(obj) as any;
  let cur = copy;
  for (const k of target.slice(0, -1)) cur = cur[k];
  cur[target[target.length - 1]] = value;
  return copy;
}

function deleteSomewhere(obj: unknown, pick: number): unknown {
  if (!obj || typeof obj !== 'object' || Array.isArray(obj)) return obj;
  const keys = Object.keys(obj);
  if (!keys.length) return obj;
  const { [keys[pick % keys.length]]: _gone, ...rest } = obj as Json;
  return rest;
}

const utf8 = (s: string) => new TextEncoder().encode(s);

/** A body for an operation: valid per its schema, or broken in one of many ways. */
function bodyArbitrary(schema: Json): fc.Arbitrary<{ bytes: Uint8Array; headers: Record<string, string>; what: string }> {
  const json = { 'content-type': 'application/json' };
  const valid = fromSchema(schema);
  const asJson = (what: string) => (v: unknown) => ({ bytes: utf8(JSON.stringify(v)), headers: json, what });
  return fc.oneof(
    { weight: 4, arbitrary: valid.map(asJson('valid')) },
    {
      weight: 3,
      arbitrary: fc
        .tuple(valid, fc.nat(), wrongValue)
        .map(([v, i, w]) => setSomewhere(v, i, w))
        .map(asJson('wrong type')),
    },
    {
      weight: 2,
      arbitrary: fc
        .tuple(valid, fc.nat())
        .map(([v, i]) => deleteSomewhere(v, i))
        .map(asJson('missing field')),
    },
    {
      weight: 2,
      arbitrary: fc
        .tuple(valid, hostileKey, wrongValue)
        .map(([v, k, w]) =>
          v && typeof v === 'object' && !Array.isArray(v)
            ? JSON.stringify(v)
                .replace(/^\{/, `{${JSON.stringify(k)}:${JSON.stringify(w)},`)
                .replace(/,\}$/, '}')
            : JSON.stringify(v),
        )
        .map((text) => ({ bytes: utf8(text), headers: json, what: 'hostile key' })),
    },
    {
      weight: 2,
      arbitrary: fc
        .tuple(valid, fc.nat(), hostileString)
        .map(([v, i, s]) => setSomewhere(v, i, s))
        .map(asJson('hostile string')),
    },
    {
      weight: 1,
      arbitrary: fc
        .tuple(valid, fc.nat(), fc.constantFrom('1e309', '-1e309', '1e-400', '123456789012345678901234567890', '-0'))
        .map(([v, i, n]) => JSON.stringify(setSomewhere(v, i, '@@NUM@@')).replace('"@@NUM@@"', n))
        .map((t) => ({ bytes: utf8(t), headers: json, what: 'huge number' })),
    },
    {
      weight: 1,
      // 10⁵ items of one wrong kind anywhere: validation must stay linear and bounded.
      arbitrary: fc
        .tuple(valid, fc.nat(), fc.constantFrom('5', 'null', '"x"', '{}', 'true', '[]', '{"type":5}'))
        .map(([v, i, item]) =>
          JSON.stringify(setSomewhere(v, i, '@@MANY@@')).replace(
            '"@@MANY@@"',
            `[${Array.from({ length: 100_000 }, () => item).join(',')}]`,
          ),
        )
        .map((t) => ({ bytes: utf8(t), headers: json, what: 'large array' })),
    },
    {
      weight: 1,
      arbitrary: fc
        .tuple(valid, fc.nat(), fc.integer({ min: 10, max: 3000 }))
        .map(([v, i, d]) => JSON.stringify(setSomewhere(v, i, '@@DEEP@@')).replace('"@@DEEP@@"', `${'['.repeat(d)}${']'.repeat(d)}`))
        .map((t) => ({ bytes: utf8(t), headers: json, what: 'deep nesting' })),
    },
    {
      weight: 1,
      arbitrary: valid
        .map((v) => JSON.stringify(v))
        .map((t) => ({
          bytes: Buffer.concat([Buffer.from(t.slice(0, Math.max(1, t.length - 1))), Buffer.from([0xff, 0xfe, 0xc3])]),
          headers: json,
          what: 'invalid UTF-8 / truncated',
        })),
    },
    {
      weight: 1,
      arbitrary: valid
        .map((v) => JSON.stringify(v))
        .map((t) => ({
          bytes: utf8(t.startsWith('{"') ? t.replace(/^\{("[^"]*"):/, '{$1:1,$1:') : t),
          headers: json,
          what: 'duplicate key',
        })),
    },
    {
      weight: 1,
      arbitrary: fc
        .tuple(
          valid,
          fc.constantFrom(
            'text/plain',
            'application/x-www-form-urlencoded',
            'application/json; charset=latin1',
            'multipart/form-data; boundary=x',
            '',
          ),
        )
        .map(([v, ct]) => ({
          bytes: utf8(JSON.stringify(v)),
          headers: (ct ? { 'content-type': ct } : {}) as Record<string, string>,
          what: `content-type ${ct || 'none'}`,
        })),
    },
    {
      weight: 1,
      arbitrary: fc.tuple(valid, fc.boolean()).map(([v, real]) => ({
        bytes: real ? new Uint8Array(zlib.gzipSync(JSON.stringify(v))) : utf8(JSON.stringify(v)),
        headers: { ...json, 'content-encoding': 'gzip' },
        what: real ? 'gzip' : 'fake gzip',
      })),
    },
    {
      weight: 1,
      arbitrary: fc
        .constantFrom('', 'null', '[]', '"x"', '{', '{"a":', '\ufeff{}', '{}'.repeat(3), '[' + '{}, '.repeat(100) + '{}]')
        .map((t) => ({ bytes: utf8(t), headers: json, what: 'malformed JSON' })),
    },
  );
}

function caseArbitrary(ops: Operation[], keys: { inference: string; management: string }): fc.Arbitrary<Case> {
  // Built once per operation: building an arbitrary from a large schema costs far more than drawing
  // a value from it (rebuilt for every case, it took most of this test's CPU). Building draws no randomness,
  // so a seed replays the same cases either way.
  const perOperation = new Map(ops.map((op) => [op, operationArbitrary(op, keys)]));
  return fc.constantFrom(...ops).chain((op) => perOperation.get(op)!);
}

function operationArbitrary(op: Operation, keys: { inference: string; management: string }): fc.Arbitrary<Case> {
  const pathParams = op.params.filter((p) => p.in === 'path');
  const queryParams = op.params.filter((p) => p.in === 'query');
  const segment = (p: Operation['params'][number]) =>
    fc.oneof(
      { weight: 2, arbitrary: fromSchema(p.schema).map((v) => encodeURIComponent(String(v))) },
      { weight: 1, arbitrary: hostileSegment },
    );
  const query = fc.array(
    fc.oneof(
      ...queryParams.map((p) =>
        fc.oneof(
          fromSchema(p.schema).map((v) => `${p.name}=${encodeURIComponent(String(v))}`),
          hostileSegment.map((s) => `${p.name}=${s}`),
        ),
      ),
      hostileSegment.map((s) => `${s}=${s}`),
    ),
    { maxLength: queryParams.length ? 3 : 1 },
  );
  const own = op.management ? keys.management : keys.inference;
  const key = fc.oneof(
    { weight: 8, arbitrary: fc.constant(own) },
    { weight: 2, arbitrary: fc.constant(keys.management) },
    { weight: 1, arbitrary: fc.constantFrom('sk-not-a-key', '') },
  );
  const method = fc.oneof(
    { weight: 9, arbitrary: fc.constant(op.method) },
    { weight: 1, arbitrary: fc.constantFrom('GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS') },
  );
  const body = op.body ? bodyArbitrary(op.body) : fc.constant(null);
  return fc
    .record({ segs: fc.tuple(...pathParams.map(segment)), query, key, method, body })
    .map(({ segs, query: q, key: k, method: m, body: b }) => {
      let path = op.path;
      pathParams.forEach((p, i) => {
        path = path.replace(`{${p.name}}`, (segs as string[])[i]);
      });
      const headers: Record<string, string> = { ...(b?.headers ?? {}) };
      if (op.auth && k) headers.authorization = `Bearer ${k}`;
      return {
        op,
        method: m,
        url: `/api/v1${path}${q.length ? `?${q.join('&')}` : ''}`,
        headers,
        body: m === 'GET' || m === 'OPTIONS' ? null : (b?.bytes ?? null),
        what: b?.what ?? 'no body',
      };
    });
}

describe('fuzz: every route, generated from its schemas and then broken', () => {
  let gw: TestGateway;
  let t: Tenant;
  let ops: Operation[];

  before(async function () {
    this.timeout(60_000);
    gw = await startTestGateway({ env: { RATE_LIMIT_REQUESTS: '1000000' } });
    t = await createTenant(gw.store, 1000);
    ops = operations((await (await fetch(`${gw.url}/api/v1/openapi.json`)).json()) as Json);
  });
  after(async () => {
    await gw.stop();
  });

  it('answers every case with a 2xx/3xx or a 4xx in the error envelope, in time; nothing refused is left half-written', async function () {
    this.timeout(600_000);
    const runs = Number(process.env.FUZZ_RUNS ?? 3000);
    const seen = new Map<string, number>();
    await fc.assert(
      fc.asyncProperty(caseArbitrary(ops, { inference: t.inferenceKey, management: t.managementKey }), async (c) => {
        const label = `${c.op.method} ${c.op.path} (${c.what})`;
        let res: Response;
        const started = performance.now();
        try {
          res = await fetch(`${gw.url}${c.url}`, {
            method: c.method,
            headers: c.headers,
            body: c.body,
            signal: AbortSignal.timeout(15_000),
          });
        } catch (err) {
          throw new Error(`${label}: no answer to ${c.method} ${c.url.slice(0, 200)}: ${String(err)}`);
        }
        const text = await res.text();
        const took = performance.now() - started;
        // A refused body of 10⁵ items costs what a small one does (generous: the suite shares the cores).
        if (c.what === 'large array' && res.status >= 400 && took > 1000)
          throw new Error(`${label}: ${res.status} after ${took.toFixed(0)} ms for ${c.method} ${c.url.slice(0, 200)}`);
        seen.set(`${res.status}`, (seen.get(`${res.status}`) ?? 0) + 1);
        if (res.status >= 500) throw new Error(`${label}: ${res.status} for ${c.method} ${c.url.slice(0, 200)}: ${text.slice(0, 300)}`);
        if (res.status >= 400) {
          const body = JSON.parse(text);
          if (body?.error?.code !== res.status || typeof body.error.message !== 'string')
            throw new Error(`${label}: ${res.status} not in the error envelope: ${text.slice(0, 200)}`);
        }
      }),
      {
        numRuns: runs,
        seed: process.env.FUZZ_SEED ? Number(process.env.FUZZ_SEED) : undefined,
        path: process.env.FUZZ_PATH,
        endOnFailure: true,
      },
    );
    process.stdout.write(`      ${runs} cases, answers by status: ${JSON.stringify(Object.fromEntries([...seen].sort()))}\n`);
    // Some of everything happened: accepted requests and every kind of refusal.
    expect([...seen.keys()].filter((s) => s.startsWith('2')).length, JSON.stringify(Object.fromEntries(seen))).to.be.greaterThan(0);
    expect(seen.get('400') ?? 0).to.be.greaterThan(runs / 10);

    // Nothing half-written: every batch's input chunks belong to a stored batch, every preset has a version.
    expect(await batchesWithoutDocument(gw.store), 'input chunks without a batch').to.deep.equal([]);
    for (const p of await gw.store.presets.find({}).toArray())
      expect(await gw.store.presetVersions.countDocuments({ preset_id: p._id }), `preset ${p.slug} without a version`).to.be.greaterThan(0);
  });
});
