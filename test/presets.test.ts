// Presets: creation and versioning from messages, chat and responses bodies, the overlap rule,
// validation, concurrency, workspace isolation, use in later requests, and the OpenRouter SDK.
import { expect } from 'chai';
import { Collection } from 'mongodb';
import { mergeTools, presetLookup, presetReference, withPreset } from '../domain/presets/apply';
import { CONFIG_KEYS, configOf } from '../domain/presets/overlap';
import { MAX_PRESETS, addPresetVersion, listPresets, type VersionView } from '../domain/presets/store';
import { PresetOrder } from '../domain/presets/list-order';
import { KeptVersions } from '../domain/presets/kept-versions';
import {
  call,
  clearOfWindowEdge,
  createTenant,
  startTestGateway,
  streamLeftEarly,
  waitForStatus,
  writeTestCatalog,
  type Tenant,
  type TestGateway,
} from './helpers';
import { endpointEntry, modelEntry, providerEntry } from '../domain/catalog/entries';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
const ISO = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;

describe('presets', () => {
  let gw: TestGateway;
  let t: Tenant;
  const post = (slug: string, body: unknown, kind = 'messages', key?: string) =>
    call(`${gw.url}/api/v1/presets/${slug}/${kind}`, { key: key ?? t.managementKey, body });
  const get = (path: string, key?: string) => call(`${gw.url}/api/v1${path}`, { key: key ?? t.inferenceKey });

  before(async () => {
    gw = await startTestGateway();
    t = await createTenant(gw.store, 5);
  });
  after(async () => {
    await gw.stop();
  });

  it('creates a preset from a messages body with the interface fields', async () => {
    const r = await post('support-bot', {
      model: 'sandbox/chat-1',
      max_tokens: 1024,
      system: 'You are a helpful assistant.',
      messages: [{ role: 'user', content: 'hi' }],
    });
    expect(r.status, JSON.stringify(r.body)).to.equal(200);
    const p = r.body.data;
    expect(p).to.include({
      name: 'support-bot',
      slug: 'support-bot',
      description: null,
      status: 'active',
      status_updated_at: null,
      workspace_id: t.workspaceId,
      creator_user_id: t.managementKeyId,
    });
    expect(p.id).to.match(UUID);
    expect(p.created_at).to.match(ISO);
    expect(p.updated_at).to.match(ISO);
    expect(p.designated_version_id).to.equal(p.designated_version.id);
    expect(p.designated_version).to.include({
      preset_id: p.id,
      version: 1,
      system_prompt: 'You are a helpful assistant.',
      creator_id: t.managementKeyId,
    });
    expect(p.designated_version.id).to.match(UUID);
    expect(p.designated_version.config).to.deep.equal({ model: 'sandbox/chat-1', max_tokens: 1024 });
  });

  it('adds version n+1 for an existing slug and makes it the designated version', async () => {
    await post('versioned', { model: 'sandbox/chat-1', max_tokens: 10 });
    const v2 = await post('versioned', { model: 'sandbox/chat-1', max_tokens: 20 });
    expect(v2.body.data.designated_version.version).to.equal(2);
    const read = await get('/presets/versioned');
    expect(read.body.data.designated_version).to.include({ version: 2 });
    expect(read.body.data.designated_version.config.max_tokens).to.equal(20);
    expect(read.body.data.id).to.equal(v2.body.data.id);
    const versions = await get('/presets/versioned/versions');
    expect(versions.body.total_count).to.equal(2);
    expect(versions.body.data.map((v: VersionView) => v.version)).to.deep.equal([1, 2]);
    const v1 = await get('/presets/versioned/versions/1');
    expect(v1.body.data.config.max_tokens).to.equal(10);
  });

  describe('the overlap rule', () => {
    const full = {
      model: 'sandbox/chat-1',
      max_tokens: 100,
      temperature: 0.5,
      top_p: 0.9,
      top_k: 40,
      stop_sequences: ['END'],
      tools: [{ name: 'lookup', input_schema: { type: 'object' } }],
      tool_choice: { type: 'auto' },
      thinking: { type: 'enabled', budget_tokens: 2000 },
      output_config: { effort: 'high', format: { type: 'json_schema', schema: { type: 'object' } } },
      plugins: [{ id: 'web', max_results: 3 }],
      provider: { sort: 'price', only: ['sandbox-alpha'] },
      cache_control: { type: 'ephemeral', ttl: '5m' },
      context_management: { edits: [] },
      service_tier: 'auto',
      speed: 'fast',
      stop_server_tools_when: [{ type: 'step_count_is', step_count: 3 }],
      safeguards: [{ type: 'pii' }],
      fallbacks: [{ model: 'sandbox/chat-1' }],
      // per-request fields, all dropped:
      messages: [{ role: 'user', content: 'x' }],
      stream: true,
      prompt: 'p',
      input: 'i',
      session_id: 's',
      user: 'u',
      trace: { trace_id: 't' },
      metadata: { user_id: 'm' },
      some_future_field: 1,
      system: [
        { type: 'text', text: 'Part one.' },
        { type: 'text', text: 'Part two.' },
      ],
    };

    it('stores every configuration field of a messages body and drops the per-request ones', async () => {
      const r = await post('overlap', full);
      expect(r.status, JSON.stringify(r.body)).to.equal(200);
      const { config, system_prompt } = r.body.data.designated_version;
      const kept = CONFIG_KEYS.messages.filter((k) => k in full);
      expect(Object.keys(config).sort()).to.deep.equal([...kept].sort());
      for (const k of kept) expect(config[k], k).to.deep.equal((full as Record<string, unknown>)[k]);
      for (const dropped of [
        'messages',
        'stream',
        'prompt',
        'input',
        'session_id',
        'user',
        'trace',
        'metadata',
        'some_future_field',
        'system',
      ]) {
        expect(config, dropped).to.not.have.property(dropped);
      }
      expect(system_prompt).to.equal('Part one.\nPart two.');
    });

    it('stores the deprecated route alias as the provider sort partition it maps to', () => {
      expect(configOf('messages', { model: 'm', route: 'fallback' }).provider).to.deep.equal({ sort: { partition: 'model' } });
      expect(configOf('messages', { model: 'm', route: 'sort', provider: { sort: 'price' } }).provider).to.deep.equal({
        sort: { by: 'price', partition: 'none' },
      });
      expect(
        configOf('messages', { model: 'm', route: 'sort', provider: { sort: { by: 'latency', partition: 'model' } } }).provider,
      ).to.deep.equal({ sort: { by: 'latency', partition: 'model' } });
      expect(configOf('messages', { model: 'm', route: null })).to.deep.equal({ model: 'm' });
    });

    it('takes the system prompt from chat system messages and from responses instructions', async () => {
      const chat = await post(
        'chat-style',
        {
          model: 'sandbox/chat-1',
          temperature: 0.7,
          messages: [
            { role: 'system', content: 'Be brief.' },
            { role: 'user', content: 'hello' },
          ],
          stream: true,
        },
        'chat/completions',
      );
      expect(chat.status, JSON.stringify(chat.body)).to.equal(200);
      expect(chat.body.data.designated_version).to.deep.include({
        system_prompt: 'Be brief.',
        config: { model: 'sandbox/chat-1', temperature: 0.7 },
      });
      const responses = await post(
        'responses-style',
        { model: 'sandbox/chat-1', instructions: 'Answer in French.', input: 'hi', max_output_tokens: 50 },
        'responses',
      );
      expect(responses.body.data.designated_version).to.deep.include({
        system_prompt: 'Answer in French.',
        config: { model: 'sandbox/chat-1', max_output_tokens: 50 },
      });
      const none = await post('no-system', { model: 'sandbox/chat-1' });
      expect(none.body.data.designated_version.system_prompt).to.equal(null);
    });
  });

  describe('validation', () => {
    const base = { model: 'sandbox/chat-1', messages: [{ role: 'user', content: 'x' }] };
    const cases: [string, unknown, string][] = [
      ['no model', { messages: [] }, 'model: is required'],
      ['max_tokens not an integer', { ...base, max_tokens: 1.5 }, 'max_tokens: must be integer'],
      ['a message role', { ...base, messages: [{ role: 'system', content: 'x' }] }, 'messages[0].role: must be one of "user", "assistant"'],
      ['system a number', { ...base, system: 5 }, 'system: must be string or array'],
      ['session_id over 256', { ...base, session_id: 's'.repeat(257) }, 'session_id: must NOT have more than 256 characters'],
      ['user over 256', { ...base, user: 'u'.repeat(257) }, 'user: must NOT have more than 256 characters'],
      ['trace not an object', { ...base, trace: [] }, 'trace: must be object'],
      ['cache control type', { ...base, cache_control: { type: 'persistent' } }, 'cache_control.type: must be "ephemeral"'],
      [
        'four fallbacks',
        { ...base, fallbacks: [{ model: 'a' }, { model: 'b' }, { model: 'c' }, { model: 'd' }] },
        'fallbacks: must NOT have more than 3 items',
      ],
      ['a fallback override', { ...base, fallbacks: [{ model: 'a', max_tokens: 5 }] }, 'fallbacks[0].max_tokens: is not an allowed field'],
      ['fallbacks with models', { ...base, fallbacks: [{ model: 'a' }], models: ['b'] }, 'fallbacks: cannot be combined with models'],
      // No call could use such a preset: it is refused when created, not on every call.
      [
        'more than 8 models in all',
        { ...base, models: Array.from({ length: 100_000 }, (_, i) => `sandbox/m-${i}`) },
        'models: at most 8 models in all, got 100001',
      ],
      ['9 models with the model', { ...base, models: ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'] }, 'models: at most 8 models in all, got 9'],
      [
        'output effort',
        { ...base, output_config: { effort: 'extreme' } },
        'output_config.effort: must be one of "low", "medium", "high", "xhigh", "max"',
      ],
      ['output format', { ...base, output_config: { format: { type: 'text' } } }, 'output_config.format.type: must be "json_schema"'],
      [
        'an unknown plugin',
        { ...base, plugins: [{ id: 'teleport' }] },
        'plugins[0].id: must be one of "auto-router", "auto-beta-router", "context-compression", "file-parser", "fusion", "moderation", "pareto-router", "response-healing", "switchyard-router", "web", "web-fetch"',
      ],
      [
        'a plugin setting',
        { ...base, plugins: [{ id: 'fusion', analysis_models: ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i'] }] },
        'plugins[0].analysis_models: must NOT have more than 8 items',
      ],
      ['provider preferences', { ...base, provider: { fastest: true } }, 'provider.fastest: is not an allowed field'],
      ['the route alias', { ...base, route: 'cheapest' }, 'route: must be one of "fallback", "sort"'],
      ['speed', { ...base, speed: 'turbo' }, 'speed: must be one of "fast", "standard"'],
      ['no stop conditions', { ...base, stop_server_tools_when: [] }, 'stop_server_tools_when: must NOT have fewer than 1 items'],
      [
        'a stop condition type',
        { ...base, stop_server_tools_when: [{ type: 'forever' }] },
        'stop_server_tools_when[0].type: must be one of "step_count_is", "has_tool_call", "max_tokens_used", "max_cost", "finish_reason_is"',
      ],
      [
        'a stop condition field',
        { ...base, stop_server_tools_when: [{ type: 'max_cost' }] },
        'stop_server_tools_when[0].max_cost_in_dollars: is required',
      ],
      ['thinking', { ...base, thinking: { type: 'enabled' } }, 'thinking.budget_tokens: is required'],
      ['tool_choice', { ...base, tool_choice: { type: 'tool' } }, 'tool_choice.name: is required'],
      ['a tool with neither name nor type', { ...base, tools: [{ description: 'x' }] }, 'tools[0].type: is required'],
    ];
    for (const [name, body, message] of cases) {
      it(`400 for ${name}`, async () => {
        const r = await post('invalid', body);
        expect(r.status, JSON.stringify(r.body)).to.equal(400);
        expect(r.body.error.message).to.equal(message);
      });
    }

    it('accepts every stop-condition variant, speed default and null forms', async () => {
      const r = await post('all-variants', {
        ...base,
        speed: null,
        route: null,
        fallbacks: null,
        stop_server_tools_when: [
          { type: 'step_count_is', step_count: 2 },
          { type: 'has_tool_call', tool_name: 'x' },
          { type: 'max_tokens_used', max_tokens: 10 },
          { type: 'max_cost', max_cost_in_dollars: 0.5 },
          { type: 'finish_reason_is', reason: 'length' },
        ],
      });
      expect(r.status, JSON.stringify(r.body)).to.equal(200);
      expect(r.body.data.designated_version.config.stop_server_tools_when).to.have.length(5);
    });

    it('rejects slugs that are not URL-safe and reads versions by whole numbers', async () => {
      expect((await post('bad%20slug', base)).status).to.equal(400);
      expect((await post('a'.repeat(129), base)).status).to.equal(400);
      expect((await get('/presets/versioned/versions/zero')).status).to.equal(400);
      expect((await get('/presets/versioned/versions/0')).status).to.equal(400);
    });
  });

  it('403 for inference keys on every create route; reads work with them', async () => {
    for (const kind of ['messages', 'chat/completions', 'responses']) {
      const r = await post('forbidden', { model: 'sandbox/chat-1' }, kind, t.inferenceKey);
      expect(r.status).to.equal(403);
      expect(r.body.error.message).to.equal('Only management keys can perform this operation');
    }
    expect((await get('/presets/support-bot')).status).to.equal(200);
  });

  it('404 for unknown slugs and versions on reads', async () => {
    expect((await get('/presets/nope')).body).to.deep.include({ error: { code: 404, message: 'Preset "nope" not found', metadata: null } });
    expect((await get('/presets/nope/versions')).status).to.equal(404);
    expect((await get('/presets/support-bot/versions/99')).status).to.equal(404);
  });

  it("is workspace-scoped: another workspace's presets do not exist for this one", async () => {
    const other = await createTenant(gw.store);
    const theirs = await post('support-bot', { model: 'sandbox/chat-1', max_tokens: 1 }, 'messages', other.managementKey);
    expect(theirs.body.data.designated_version.version).to.equal(1); // same slug, its own preset
    expect(theirs.body.data.id).to.not.equal((await get('/presets/support-bot')).body.data.id);
    expect((await get('/presets/versioned', other.inferenceKey)).status).to.equal(404);
    expect((await get('/presets/versioned/versions/1', other.inferenceKey)).status).to.equal(404);
    const list = await get('/presets', other.inferenceKey);
    expect(list.body.data.map((p: { slug: string }) => p.slug)).to.deep.equal(['support-bot']);
  });

  it('lists presets most recently updated first, with offset and limit', async () => {
    const tenant = await createTenant(gw.store);
    for (const slug of ['p-a', 'p-b', 'p-c']) await post(slug, { model: 'sandbox/chat-1' }, 'messages', tenant.managementKey);
    await post('p-a', { model: 'sandbox/chat-1', max_tokens: 5 }, 'messages', tenant.managementKey);
    const all = await get('/presets', tenant.inferenceKey);
    expect(all.body.total_count).to.equal(3);
    expect(all.body.data.map((p: { slug: string }) => p.slug)).to.deep.equal(['p-a', 'p-c', 'p-b']);
    const page = await get('/presets?offset=1&limit=1', tenant.inferenceKey);
    expect(page.body.data.map((p: { slug: string }) => p.slug)).to.deep.equal(['p-c']);
    expect((await get('/presets?limit=101', tenant.inferenceKey)).status).to.equal(400);
    expect((await get('/presets?offset=-1', tenant.inferenceKey)).status).to.equal(400);
  });

  it("each process keeps a workspace's order between listings, read again only once a write has changed the workspace's mark, or after 10 s", async () => {
    const tenant = await createTenant(gw.store);
    const add = (slug: string, maxTokens = 1) =>
      addPresetVersion(gw.store, {
        workspaceId: tenant.workspaceId,
        slug,
        creator: tenant.managementKeyId,
        config: { model: 'sandbox/chat-1', max_tokens: maxTokens },
        systemPrompt: null,
      });
    for (const slug of ['o-a', 'o-b', 'o-c']) await add(slug);
    let now = 1_000_000;
    // Two processes' orders over one database: `here` lists, `there` only writes (through add).
    const here = new PresetOrder(100_000, () => now);
    const listReads = { n: 0 };
    const proto = Collection.prototype as unknown as { find: (...args: unknown[]) => unknown };
    const find = proto.find;
    proto.find = function (this: Collection, ...args: unknown[]) {
      if (this.collectionName === 'workspace_presets') listReads.n++;
      return find.apply(this, args);
    };
    const slugs = async () => (await listPresets(gw.store, tenant.workspaceId, 0, 10, { order: here })).data.map((p) => p.slug);
    try {
      expect(await slugs()).to.deep.equal(['o-c', 'o-b', 'o-a']);
      expect(await slugs()).to.deep.equal(['o-c', 'o-b', 'o-a']);
      expect(listReads.n, 'the second listing reads no list entries').to.equal(1);
      // Another process writes a version of o-a: the mark changes, and the next listing sees it first.
      await add('o-a', 2);
      expect(await slugs()).to.deep.equal(['o-a', 'o-c', 'o-b']);
      expect(listReads.n).to.equal(2);
      // A writer that died between its entry and its mark: the kept order is used for 10 s at most.
      await gw.store.db.collection('workspace_presets').updateOne(
        {
          _id: `${tenant.workspaceId}:${(await gw.store.presets.findOne({ workspace_id: tenant.workspaceId, slug: 'o-b' }))!._id}`,
        } as object,
        {
          $set: { updated_at: new Date(Date.now() + 60_000) },
        },
      );
      now += 9_000;
      expect(await slugs()).to.deep.equal(['o-a', 'o-c', 'o-b']);
      now += 1_000;
      expect(await slugs()).to.deep.equal(['o-b', 'o-a', 'o-c']);
      expect(listReads.n).to.equal(3);
    } finally {
      proto.find = find;
    }
    // What is kept is counted in entries against the process's budget (the eviction is SizedLru's:
    // test/unit/page-cache.test.ts).
    expect(here.heldEntries).to.equal(3);
  });

  it("the list is ordered from the workspace's list alone: a page reads its own presets and newest versions only; a preset listed by an earlier version is placed by reading it", async () => {
    const tenant = await createTenant(gw.store);
    const slugs = ['q-0', 'q-1', 'q-2', 'q-3', 'q-4', 'q-5'];
    for (const slug of slugs)
      await post(slug, { model: 'sandbox/chat-1', system: `${slug} ${'s'.repeat(100_000)}` }, 'messages', tenant.managementKey);
    await post('q-1', { model: 'sandbox/chat-1', max_tokens: 5 }, 'messages', tenant.managementKey); // q-1 is now the newest
    // As stored by an earlier version: q-3's list entry has no time or slug, its preset no updated_at.
    const q3 = (await gw.store.presets.findOne({ workspace_id: tenant.workspaceId, slug: 'q-3' }))!;
    await gw.store.presets.updateOne({ _id: q3._id }, { $unset: { updated_at: '' } });
    await gw.store.db
      .collection('workspace_presets')
      .updateOne({ _id: `${tenant.workspaceId}:${q3._id}` } as object, { $unset: { updated_at: '', slug: '' } });
    const reads: { collection: string; ids: number; projected: boolean }[] = [];
    const proto = Collection.prototype as unknown as { find: (...args: unknown[]) => unknown };
    const find = proto.find;
    proto.find = function (this: Collection, ...args: unknown[]) {
      if (this.collectionName === 'preset_versions' || this.collectionName === 'presets') {
        const filter = args[0] as { _id?: string | { $in?: unknown[] } };
        reads.push({
          collection: this.collectionName,
          ids: typeof filter._id === 'string' ? 1 : (filter._id?.$in?.length ?? -1),
          projected: Object.keys((args[1] as { projection?: object })?.projection ?? {}).length > 0,
        });
      }
      return find.apply(this, args);
    };
    let page: Awaited<ReturnType<typeof get>>;
    try {
      page = await get('/presets?limit=2', tenant.inferenceKey);
    } finally {
      proto.find = find;
    }
    expect(page.body.total_count).to.equal(6);
    expect(page.body.data.map((p: { slug: string }) => p.slug)).to.deep.equal(['q-1', 'q-5']);
    expect(page.body.data[1].designated_version.system_prompt).to.have.length(100_004); // the page's versions, whole
    // Presets read: q-3 (to place it), then the page's two; never all six.
    expect(reads.filter((r) => r.collection === 'presets').map((r) => r.ids)).to.deep.equal([1, 2]);
    // Versions, without configs: which of q-3's is newest, that one's time, and whether any of the
    // page's two is newer than its hint (the two ids above each); then the page's two designated
    // versions whole, one at a time.
    const versions = reads.filter((r) => r.collection === 'preset_versions');
    expect(versions.filter((r) => r.projected).map((r) => r.ids)).to.deep.equal([2, 1, 4]);
    expect(versions.filter((r) => !r.projected).map((r) => r.ids)).to.deep.equal([1, 1]);
    // q-3's entry now holds its time (written after the answer): later listings read no preset to place it.
    let healed = null;
    for (let i = 0; i < 50 && !healed?.updated_at; i++) {
      await new Promise((res) => setTimeout(res, 20));
      healed = await gw.store.db.collection('workspace_presets').findOne({ _id: `${tenant.workspaceId}:${q3._id}` } as object);
    }
    expect(healed).to.include({ slug: 'q-3' });
    expect(healed!.updated_at).to.be.instanceOf(Date);
    const all = await get('/presets', tenant.inferenceKey);
    expect(all.body.data.map((p: { slug: string }) => p.slug)).to.deep.equal(['q-1', 'q-5', 'q-4', 'q-3', 'q-2', 'q-0']);
    expect(all.body.data.find((p: { slug: string }) => p.slug === 'q-1').designated_version.version).to.equal(2);
  });

  it('a call naming a preset reads its designated version whole once per process (versions never change); a newer one is used at once', async () => {
    const tenant = await createTenant(gw.store);
    const add = (prompt: string) =>
      addPresetVersion(gw.store, {
        workspaceId: tenant.workspaceId,
        slug: 'kept',
        creator: tenant.managementKeyId,
        config: { model: 'sandbox/chat-1' },
        systemPrompt: prompt,
      });
    const whole = { n: 0 };
    const proto = Collection.prototype as unknown as { find: (...args: unknown[]) => unknown };
    const find = proto.find;
    proto.find = function (this: Collection, ...args: unknown[]) {
      const projected = Object.keys((args[1] as { projection?: object })?.projection ?? {}).length > 0;
      if (this.collectionName === 'preset_versions' && !projected) whole.n++;
      return find.apply(this, args);
    };
    try {
      const kept = new KeptVersions();
      const lookup = presetLookup(gw.store, tenant.workspaceId, kept);
      await add('first');
      for (let i = 0; i < 3; i++) expect((await lookup('kept')).version.system_prompt).to.equal('first');
      expect(whole.n, 'three calls, one whole read').to.equal(1);
      await add('second');
      expect((await lookup('kept')).version.system_prompt).to.equal('second');
      expect((await lookup('kept')).version.system_prompt).to.equal('second');
      expect(whole.n).to.equal(2);
      // Without a process's versions kept, every call reads its version whole.
      const unkept = presetLookup(gw.store, tenant.workspaceId);
      for (let i = 0; i < 2; i++) await unkept('kept');
      expect(whole.n).to.equal(4);
    } finally {
      proto.find = find;
    }
  });

  it('a page of versions or presets ends once it holds 16 MB of configs (with at least one), so no answer outgrows memory', async () => {
    const tenant = await createTenant(gw.store);
    const big = (slug: string, i: number) =>
      addPresetVersion(gw.store, {
        workspaceId: tenant.workspaceId,
        slug,
        creator: tenant.managementKeyId,
        config: { model: 'sandbox/chat-1' },
        systemPrompt: `${i}`.padEnd(9_000_000, 'x'),
      });
    for (let i = 1; i <= 3; i++) await big('heavy', i);
    const page = await get('/presets/heavy/versions?limit=10', tenant.inferenceKey);
    expect(page.status).to.equal(200);
    expect(page.body.total_count).to.equal(3);
    expect(page.body.data.map((v: VersionView) => v.version)).to.deep.equal([1, 2]);
    const rest = await get('/presets/heavy/versions?offset=2&limit=10', tenant.inferenceKey);
    expect(rest.body.data.map((v: VersionView) => v.version)).to.deep.equal([3]);
    for (const slug of ['heavy-b', 'heavy-c']) await big(slug, 4);
    const presets = await get('/presets?limit=10', tenant.inferenceKey);
    expect(presets.status).to.equal(200);
    expect(presets.body.total_count).to.equal(3);
    expect(presets.body.data.map((p: { slug: string }) => p.slug)).to.deep.equal(['heavy-c', 'heavy-b']);
    const last = await get('/presets?offset=2&limit=10', tenant.inferenceKey);
    expect(last.body.data.map((p: { slug: string }) => p.slug)).to.deep.equal(['heavy']);
    expect(last.body.data[0].designated_version.version).to.equal(3);
  });

  it(`a workspace holds at most ${MAX_PRESETS} presets: a new slug past that is a 400; versions of those it has are still added`, async () => {
    const tenant = await createTenant(gw.store);
    await post('kept', { model: 'sandbox/chat-1' }, 'messages', tenant.managementKey);
    // The rest of the workspace's list, as if created: the bound counts the list.
    await gw.store.db
      .collection('workspace_presets')
      .insertMany(
        Array.from({ length: MAX_PRESETS - 1 }, (_, i) => ({ _id: `${tenant.workspaceId}:filler-${i}`, ref: `filler-${i}` }) as object),
      );
    const refused = await post('one-more', { model: 'sandbox/chat-1' }, 'messages', tenant.managementKey);
    expect(refused.status).to.equal(400);
    expect(refused.body.error.message).to.include(`at most ${MAX_PRESETS} presets`);
    expect((await get('/presets/one-more', tenant.inferenceKey)).status).to.equal(404);
    const version = await post('kept', { model: 'sandbox/chat-1', max_tokens: 3 }, 'messages', tenant.managementKey);
    expect(version.status).to.equal(200);
    expect(version.body.data.designated_version.version).to.equal(2);
  });

  describe('deletion', () => {
    const del = (slug: string, key: string) => call(`${gw.url}/api/v1/presets/${slug}`, { method: 'DELETE', key });
    const storedBytes = async (key: string) => (await get('/storage', key)).body.data.stored_bytes as number;

    it("removes the preset, its versions and its listing, gives their size back to the storage quota, and calls naming it are a 404; management keys only, the workspace's own only", async () => {
      const tenant = await createTenant(gw.store, 5);
      const before = await storedBytes(tenant.inferenceKey);
      for (let i = 0; i < 3; i++)
        expect(
          (await post('gone', { model: 'sandbox/chat-1', system: `v${i} ${'s'.repeat(10_000)}` }, 'messages', tenant.managementKey)).status,
        ).to.equal(200);
      await post('stays', { model: 'sandbox/chat-1' }, 'messages', tenant.managementKey);
      const presetId = (await get('/presets/gone', tenant.inferenceKey)).body.data.id;
      expect(await storedBytes(tenant.inferenceKey)).to.be.above(before + 30_000);
      const chat = { model: 'sandbox/chat-1', preset: 'gone', messages: [{ role: 'user', content: 'hi' }], max_tokens: 3 };
      expect((await call(`${gw.url}/api/v1/chat/completions`, { key: tenant.inferenceKey, body: chat })).status).to.equal(200);

      expect((await del('gone', tenant.inferenceKey)).status).to.equal(403);
      const other = await createTenant(gw.store);
      expect((await del('gone', other.managementKey)).status).to.equal(404);

      const deleted = await del('gone', tenant.managementKey);
      expect(deleted.status, JSON.stringify(deleted.body)).to.equal(200);
      expect(deleted.body).to.deep.equal({ data: { id: presetId, slug: 'gone', deleted: true } });
      expect((await get('/presets/gone', tenant.inferenceKey)).status).to.equal(404);
      expect((await get('/presets/gone/versions', tenant.inferenceKey)).status).to.equal(404);
      expect((await get('/presets/gone/versions/1', tenant.inferenceKey)).status).to.equal(404);
      const listed = await get('/presets', tenant.inferenceKey);
      expect(listed.body.data.map((p: { slug: string }) => p.slug)).to.deep.equal(['stays']);
      expect(listed.body.total_count).to.equal(1);
      const refused = await call(`${gw.url}/api/v1/chat/completions`, { key: tenant.inferenceKey, body: chat });
      expect(refused.status).to.equal(404);
      expect(refused.body.error.message).to.equal('Preset "gone" not found');
      expect(await gw.store.presetVersions.countDocuments({ preset_id: presetId })).to.equal(0);
      expect(await gw.store.presets.countDocuments({ _id: presetId })).to.equal(0);
      expect(await storedBytes(tenant.inferenceKey)).to.be.below(before + 1_000); // 'stays' is all that is left
      expect((await del('gone', tenant.managementKey)).status).to.equal(404);
    });

    it('batch lines of a chunk already running are refused within seconds of the deletion, as calls are (before: the rest of the chunk was served)', async function () {
      this.timeout(90_000);
      // One line at a time, 400 ms each: one chunk of 30 lines runs ~12 s.
      const catalog = writeTestCatalog('preset-midchunk', (c) => {
        c.providers.push(providerEntry('midchunk', '${SANDBOX_URL}/~midchunk=1,latency=400/openai/v1'));
        c.models.push(modelEntry('test/midchunk', [endpointEntry('midchunk', 1)]));
      });
      const slow = await startTestGateway({ withWorker: true, env: { CATALOG_PATH: catalog, BATCH_LINE_CONCURRENCY: '1' } });
      try {
        const tenant = await createTenant(slow.store, 5);
        const made = await call(`${slow.url}/api/v1/presets/midchunk/chat/completions`, {
          key: tenant.managementKey,
          body: { model: 'test/midchunk', max_tokens: 5 },
        });
        expect(made.status, JSON.stringify(made.body)).to.equal(200);
        const requests = Array.from({ length: 30 }, (_, i) => ({
          custom_id: `l${i}`,
          body: { model: '@preset/midchunk', messages: [{ role: 'user', content: `line ${i}` }] },
        }));
        const batch = await call(`${slow.url}/api/v1/batches`, {
          key: tenant.inferenceKey,
          body: { endpoint: '/v1/chat/completions', model: 'test/midchunk', requests },
        });
        expect(batch.status, JSON.stringify(batch.body)).to.equal(202);
        // Deleted once a few lines are done.
        for (let done = 0; done < 3;) {
          await new Promise((r) => setTimeout(r, 200));
          done = (await call(`${slow.url}/api/v1/batches/${batch.body.id}`, { key: tenant.inferenceKey })).body.request_counts.completed;
        }
        const deleted = await call(`${slow.url}/api/v1/presets/midchunk`, { method: 'DELETE', key: tenant.managementKey });
        expect(deleted.status).to.equal(200);
        const done = await waitForStatus(slow.url, tenant.inferenceKey, batch.body.id, ['completed', 'failed'], 60_000);
        // Lines that ran within the recheck (5 s, ~13 lines) after the deletion were served; the rest were refused.
        expect(done.request_counts.failed, JSON.stringify(done.request_counts)).to.be.at.least(8);
        expect(done.request_counts.completed).to.be.at.least(3);
        const failed = done.results.find((r: { error: unknown }) => r.error);
        expect(failed.error).to.deep.include({ code: 404, message: 'Preset "midchunk" not found' });
      } finally {
        await slow.stop();
      }
    });

    it('its slug may be created again, from version 1, under new version ids: a process that kept the old version 1 applies the new one', async () => {
      const tenant = await createTenant(gw.store);
      const lookup = presetLookup(gw.store, tenant.workspaceId, new KeptVersions());
      await post('again', { model: 'sandbox/chat-1', system: 'old' }, 'messages', tenant.managementKey);
      const old = await lookup('again');
      expect(old.version.system_prompt).to.equal('old');
      expect((await del('again', tenant.managementKey)).status).to.equal(200);
      const gone = await lookup('again').then(
        () => null,
        (err: Error) => err,
      );
      expect(gone?.message).to.equal('Preset "again" not found');
      const created = await post('again', { model: 'sandbox/chat-1', system: 'new' }, 'messages', tenant.managementKey);
      expect(created.body.data.designated_version.version).to.equal(1);
      expect(created.body.data.designated_version.id).to.not.equal(old.version.id);
      expect((await lookup('again')).version.system_prompt).to.equal('new');
      const versions = await get('/presets/again/versions', tenant.inferenceKey);
      expect(versions.body.data.map((v: VersionView) => [v.version, v.system_prompt])).to.deep.equal([[1, 'new']]);
    });

    it('versions written while the preset is deleted leave nothing behind: afterwards its versions are exactly those listed', async () => {
      const tenant = await createTenant(gw.store);
      for (let i = 0; i < 30; i++) await post('raced', { model: 'sandbox/chat-1', max_tokens: i + 1 }, 'messages', tenant.managementKey);
      const presetId = (await get('/presets/raced', tenant.inferenceKey)).body.data.id;
      const writes = Array.from({ length: 8 }, (_, i) =>
        post('raced', { model: 'sandbox/chat-1', max_tokens: 100 + i }, 'messages', tenant.managementKey),
      );
      const deleted = await del('raced', tenant.managementKey);
      expect(deleted.status).to.equal(200);
      for (const w of await Promise.all(writes)) expect([200, 409]).to.include(w.status);
      const listed = await get('/presets/raced/versions?limit=100', tenant.inferenceKey);
      const stored = await gw.store.presetVersions.countDocuments({ preset_id: presetId });
      expect(stored).to.equal(listed.status === 404 ? 0 : listed.body.total_count);
      // What is left, if anything, is a preset the racing writes created again: none of the 30 deleted.
      expect(stored).to.be.at.most(8);
    });
  });

  it('concurrent writers: contiguous version numbers, no lost or doubled version, losers get 409', async () => {
    const tenant = await createTenant(gw.store);
    await post('busy', { model: 'sandbox/chat-1', max_tokens: 1 }, 'messages', tenant.managementKey);
    const results = await Promise.all(
      Array.from({ length: 12 }, (_, i) =>
        post('busy', { model: 'sandbox/chat-1', max_tokens: 100 + i }, 'messages', tenant.managementKey),
      ),
    );
    const won = results.filter((r) => r.status === 200);
    const lost = results.filter((r) => r.status === 409);
    expect(won.length + lost.length).to.equal(12);
    expect(won.length).to.be.at.least(1);
    for (const r of lost) expect(r.body.error.code).to.equal(409);
    const versions = (await get('/presets/busy/versions', tenant.inferenceKey)).body.data as VersionView[];
    expect(versions.map((v) => v.version)).to.deep.equal(Array.from({ length: versions.length }, (_, i) => i + 1));
    expect(versions.length).to.equal(1 + won.length); // every 200 is a version, every 409 is not
    const winners = won.map((r) => r.body.data.designated_version.config.max_tokens).sort();
    expect(
      versions
        .slice(1)
        .map((v) => v.config.max_tokens)
        .sort(),
    ).to.deep.equal(winners);
  });

  describe('using a preset', () => {
    it('parses every way of naming a preset', () => {
      expect(presetReference({ model: '@preset/abc' })).to.deep.equal({ slug: 'abc', model: null });
      expect(presetReference({ model: 'sandbox/chat-1@preset/abc' })).to.deep.equal({ slug: 'abc', model: 'sandbox/chat-1' });
      expect(presetReference({ model: 'sandbox/chat-1', preset: 'abc' })).to.deep.equal({ slug: 'abc', model: 'sandbox/chat-1' });
      expect(presetReference({ model: 'sandbox/chat-1' })).to.equal(null);
    });

    it('merges: request fields win, the system prompt is prepended, tools merge by name', async () => {
      const version = {
        config: {
          model: 'sandbox/chat-1',
          temperature: 0.2,
          max_tokens: 50,
          tools: [
            { type: 'function', function: { name: 'a', v: 1 } },
            { type: 'function', function: { name: 'b' } },
          ],
        },
        system_prompt: 'Be kind.',
      } as unknown as VersionView;
      const lookup = async () => ({ version, chars: 123 });
      const { body: chat, addedChars } = await withPreset(
        {
          model: '@preset/x',
          temperature: 0.9,
          messages: [{ role: 'user', content: 'hi' }],
          tools: [
            { type: 'function', function: { name: 'a', v: 2 } },
            { type: 'function', function: { name: 'c' } },
          ],
        },
        'chat',
        lookup,
      );
      expect(chat).to.deep.include({ model: 'sandbox/chat-1', temperature: 0.9, max_tokens: 50 });
      expect(addedChars, 'what the preset adds to the prompt').to.equal(123);
      expect(chat.messages).to.deep.equal([
        { role: 'system', content: 'Be kind.' },
        { role: 'user', content: 'hi' },
      ]);
      expect(chat.tools.map((t: any) => [t.function.name, t.function.v])).to.deep.equal([
        ['a', 2],
        ['b', undefined],
        ['c', undefined],
      ]);
      const { body: messages } = await withPreset(
        { model: 'other/model@preset/x', system: 'And brief.', messages: [] },
        'messages',
        lookup,
      );
      expect(messages.model).to.equal('other/model');
      expect(messages.system).to.deep.equal([
        { type: 'text', text: 'Be kind.' },
        { type: 'text', text: 'And brief.' },
      ]);
      expect((await withPreset({ preset: 'x', input: 'q' }, 'responses', lookup)).body).to.deep.include({
        instructions: 'Be kind.',
        model: 'sandbox/chat-1',
      });
      // The preset's output cap (max_tokens here) is max_output_tokens in the Responses shape, unless the request sets one.
      const { body: capped } = await withPreset({ preset: 'x', input: 'q' }, 'responses', lookup);
      expect(capped).to.include({ max_output_tokens: 50 }).and.not.have.property('max_tokens');
      expect((await withPreset({ preset: 'x', input: 'q', max_output_tokens: 9 }, 'responses', lookup)).body).to.include({
        max_output_tokens: 9,
      });
      // A decision borrows the model and provider preferences only.
      const decision = await withPreset({ preset: 'x', state: 's' }, 'decision', lookup);
      expect(decision.body).to.include({ model: 'sandbox/chat-1', state: 's' }).and.not.have.any.keys('max_tokens', 'tools', 'temperature');
      expect(decision.addedChars, 'nothing of the preset goes upstream').to.equal(0);
      expect((await withPreset({ model: 'sandbox/chat-1', messages: [] }, 'chat', lookup)).addedChars).to.equal(0);
      const modelless = async () => ({ version: { config: {}, system_prompt: null } as unknown as VersionView, chars: 2 });
      const refused = await withPreset({ model: '@preset/x', state: 's' }, 'decision', modelless).catch((e) => e);
      expect(refused).to.include({ status: 400 });
      expect(refused.message).to.match(/preset "x" names no model/);
      expect(mergeTools(undefined, [{ name: 'z' }])).to.deep.equal([{ name: 'z' }]);
    });

    it('a decision request with "model": "@preset/<slug>" uses the preset\'s model and routing', async () => {
      await post('decider', { model: 'typesafe/jev-chat-1', provider: { only: ['sandbox-beta'] } });
      const q = { q: { type: 'noul', instructions: 'ok?' } };
      const r = await call(`${gw.url}/api/v1/systemone`, {
        key: t.inferenceKey,
        body: { model: '@preset/decider', state: 'x', questions: q },
      });
      expect(r.status, JSON.stringify(r.body)).to.equal(200);
      expect(r.body).to.include({ model: 'typesafe/jev-chat-1-20261001', provider: 'sandbox-beta' });
      // The request's own provider preferences win over the preset's.
      const own = await call(`${gw.url}/api/v1/systemone`, {
        key: t.inferenceKey,
        body: { model: '@preset/decider', state: 'x', questions: q, provider: { only: ['sandbox-alpha'] } },
      });
      expect(own.body.provider).to.equal('sandbox-alpha');
      const missing = await call(`${gw.url}/api/v1/systemone`, {
        key: t.inferenceKey,
        body: { model: '@preset/nothing-here', state: 'x', questions: q },
      });
      expect(missing.status).to.equal(404);
      expect(missing.body.error.message).to.equal('Preset "nothing-here" not found');
    });
  });

  it('@openrouter/sdk parses create, get, list and listVersions', async () => {
    const { OpenRouter } = await import('@openrouter/sdk');
    const sdk = new OpenRouter({ apiKey: t.managementKey, serverURL: `${gw.url}/api/v1` });
    const created = await sdk.presets.createPresetsMessages({
      slug: 'sdk-preset',
      messagesRequest: {
        model: 'sandbox/chat-1',
        maxTokens: 256,
        system: 'From the SDK.',
        messages: [{ role: 'user', content: 'hi' }],
      } as any,
    });
    expect(created.data.slug).to.equal('sdk-preset');
    expect(created.data.designatedVersion!.systemPrompt).to.equal('From the SDK.');
    expect(created.data.designatedVersion!.config).to.deep.equal({ model: 'sandbox/chat-1', max_tokens: 256 });
    const got = await sdk.presets.get({ slug: 'sdk-preset' });
    expect(got.data.designatedVersion!.version).to.equal(1);
    const listed = await sdk.presets.list({});
    const page = (listed as any).result ?? listed;
    expect(page.data.map((p: { slug: string }) => p.slug)).to.include('sdk-preset');
    const versions = await sdk.presets.listVersions({ slug: 'sdk-preset' });
    const vpage = (versions as any).result ?? versions;
    expect(vpage.totalCount).to.equal(1);
  });
});

describe("a preset's prompt counts as the call's own", function () {
  this.timeout(60_000);
  const PROMPT_CHARS = 400_000; // 100,000 tokens as the sandbox counts them (4 characters a token); held as 133,000
  let gw: TestGateway;
  before(async () => {
    // $1 per million tokens in and out; answers streamed one word every 200 ms.
    const catalog = writeTestCatalog('preset-cost', (c) => {
      c.providers.push(providerEntry('presetcost', '${SANDBOX_URL}/~presetcost=1,chunk_delay=200,max_words=30/openai/v1'));
      c.models.push(
        modelEntry('test/preset-cost', [endpointEntry('presetcost', 1, { supported_parameters: ['max_tokens'] })], {
          context_length: 1_000_000,
        }),
      );
    });
    gw = await startTestGateway({ env: { CATALOG_PATH: catalog } });
  });
  after(async () => {
    await gw.stop();
  });

  /** A tenant with a preset whose system prompt is PROMPT_CHARS long. */
  async function withBigPreset(credits: number, on = gw): Promise<Tenant> {
    const t = await createTenant(on.store, credits);
    const created = await call(`${on.url}/api/v1/presets/big/chat/completions`, {
      key: t.managementKey,
      body: { model: 'test/preset-cost', messages: [{ role: 'system', content: 'p'.repeat(PROMPT_CHARS) }] },
    });
    expect(created.status, JSON.stringify(created.body)).to.equal(200);
    return t;
  }
  const small = { model: '@preset/big', messages: [{ role: 'user', content: 'hi' }], max_tokens: 3 };

  it("is held before the call: concurrent calls naming it overspend the workspace's credit by one estimate at most (before: each held as a 20-byte prompt, $0.60 spent of $0.25)", async () => {
    const t = await withBigPreset(0.25);
    const rs = await Promise.all(
      Array.from({ length: 6 }, () => call(`${gw.url}/api/v1/chat/completions`, { key: t.inferenceKey, body: small })),
    );
    const statuses = rs.map((r) => r.status);
    expect(statuses).to.include(200);
    expect(statuses).to.include(402);
    expect(rs.find((r) => r.status === 200)!.body.usage.prompt_tokens).to.be.at.least(PROMPT_CHARS / 4);
    await gw.usage.flushed();
    const credits = await call(`${gw.url}/api/v1/credits`, { key: t.inferenceKey });
    // A call's estimate: one token per 3 characters of its prompt, the preset's included, at $1 a million.
    expect(credits.body.data.balance).to.be.at.least(-(PROMPT_CHARS + 200) / 3 / 1e6);
  });

  it('is held by each batch line naming it: the batch overspends by one estimate at most (before: every line held as its own small body)', async () => {
    const t = await withBigPreset(0.25);
    const created = await call(`${gw.url}/api/v1/batches`, {
      key: t.inferenceKey,
      body: {
        endpoint: '/v1/chat/completions',
        model: 'test/preset-cost',
        requests: Array.from({ length: 6 }, (_, i) => ({
          custom_id: `l${i}`,
          body: { preset: 'big', messages: [{ role: 'user', content: `${i}` }], max_tokens: 3 },
        })),
      },
    });
    expect(created.status, JSON.stringify(created.body)).to.equal(202);
    const done = await waitForStatus(gw.url, t.inferenceKey, created.body.id, ['completed']);
    const codes = done.results.map(
      (r: { response?: { status_code: number }; error?: { code: number } }) => r.response?.status_code ?? r.error?.code,
    );
    expect(codes).to.include(200);
    expect(codes).to.include(402);
    const credits = await call(`${gw.url}/api/v1/credits`, { key: t.inferenceKey });
    expect(credits.body.data.balance).to.be.at.least(-(PROMPT_CHARS + 200) / 3 / 1e6);
  });

  it('is billed for a stream its client leaves before the provider counted the prompt (before: 33 prompt tokens)', async () => {
    const t = await withBigPreset(5);
    const record = await streamLeftEarly(gw, t.inferenceKey, { ...small, max_tokens: 30 });
    expect(record.input_tokens).to.be.at.least(PROMPT_CHARS / 4);
  });

  it('counts against BODY_BYTES_PER_MINUTE with each call naming it (before: a 9 MB preset named by tiny bodies sent 64 MB/s upstream past a 10 MB/s limit)', async () => {
    // 1 MB a minute: the preset's creation counts 6 of its 16 units of 64 KB, each call naming it 6 more.
    const limited = await startTestGateway({ env: { CATALOG_PATH: gw.config.catalogPath, BODY_BYTES_PER_MINUTE: '1mb' } });
    try {
      // The minute is aligned to the epoch: the preset's creation and both calls must fall in one (a CI run's crossed an edge).
      await clearOfWindowEdge(60, 20_000);
      const t = await withBigPreset(5, limited);
      const first = await call(`${limited.url}/api/v1/chat/completions`, { key: t.inferenceKey, body: small });
      expect(first.status, JSON.stringify(first.body)).to.equal(200);
      const second = await call(`${limited.url}/api/v1/chat/completions`, { key: t.inferenceKey, body: small });
      expect(second.status, JSON.stringify(second.body)).to.equal(429);
      expect(second.body.error.message).to.equal(
        'Request body rate limit exceeded: 1 MB of request bodies per 60s for this workspace, over all its keys',
      );
      // A call without the preset, of a small body, is not counted.
      const plain = await call(`${limited.url}/api/v1/chat/completions`, {
        key: t.inferenceKey,
        body: { ...small, model: 'test/preset-cost' },
      });
      expect(plain.status, JSON.stringify(plain.body)).to.equal(200);
    } finally {
      await limited.stop();
    }
  });
});
