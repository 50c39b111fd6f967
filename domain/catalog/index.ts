// The model catalog: the one source of truth for providers, models, endpoints and prices. Loaded
// from a JSON file, validated at start-up with messages naming the bad entry.
import fs from 'node:fs';
import path from 'node:path';
import { compileBody } from '../../infrastructure/validation/index';
import { BadRequestError, NotFoundError } from '../../infrastructure/errors';
import { operationsOf, PROVIDER_FORMATS } from '../../infrastructure/providers/formats';
import { CatalogFile, type EndpointEntry, type ModelEntry, type Operation, type ProviderEntry } from './schema';

export * from './schema';

/** Bare model ids (no `author/`) are read in this namespace: `jev-1.13` → `typesafe/jev-1.13`. */
const DEFAULT_NAMESPACE = 'typesafe';

export class CatalogError extends Error {}

export interface Endpoint {
  /** Unique across the catalog: `model@provider[/variant]`. */
  key: string;
  /** `provider` or `provider/variant`: what `order`, `only` and `ignore` match. */
  tag: string;
  model: CatalogModel;
  provider: ProviderEntry;
  entry: EndpointEntry;
  operations: readonly Operation[];
}

export interface CatalogModel extends Omit<ModelEntry, 'endpoints'> {
  canonicalId: string;
  endpoints: Endpoint[];
}

export type ModelVariant = 'nitro' | 'floor' | 'online' | null;

const validateFile = compileBody(CatalogFile);

function compareVersions(a: string, b: string): number {
  const pa = a.split('.').map(Number);
  const pb = b.split('.').map(Number);
  for (let i = 0; i < Math.max(pa.length, pb.length); i++) {
    const d = (pa[i] ?? 0) - (pb[i] ?? 0);
    if (d) return d;
  }
  return 0;
}

export class Catalog {
  readonly providers = new Map<string, ProviderEntry>();
  readonly models: CatalogModel[] = [];
  private readonly byId = new Map<string, CatalogModel>();

  private constructor(file: CatalogFile, env: Record<string, string | undefined>, source: string) {
    const fail = (where: string, message: string): never => {
      throw new CatalogError(`Invalid catalog ${source}: ${where}: ${message}`);
    };
    for (const [i, p] of file.providers.entries()) {
      if (this.providers.has(p.slug)) fail(`providers[${i}] (${p.slug})`, 'duplicate provider slug');
      const baseUrl = p.base_url.replace(
        /\$\{([A-Z_][A-Z0-9_]*)\}/g,
        (_, name: string) => env[name] ?? fail(`providers[${i}] (${p.slug}).base_url`, `environment variable ${name} is not set`),
      );
      try {
        new URL(baseUrl);
      } catch {
        fail(`providers[${i}] (${p.slug}).base_url`, `not a URL: ${baseUrl}`);
      }
      this.providers.set(p.slug, { ...p, base_url: baseUrl.replace(/\/+$/, '') });
    }
    for (const [i, m] of file.models.entries()) {
      const where = `models[${i}] (${m.id})`;
      if (this.byId.has(m.id)) fail(where, 'duplicate model id');
      const model: CatalogModel = { ...m, canonicalId: `${m.id}-${m.released}`, endpoints: [] };
      const tags = new Set<string>();
      for (const [j, e] of m.endpoints.entries()) {
        const provider = this.providers.get(e.provider) ?? fail(`${where}.endpoints[${j}].provider`, `unknown provider "${e.provider}"`);
        const tag = e.variant ? `${e.provider}/${e.variant}` : e.provider;
        if (tags.has(tag)) fail(`${where}.endpoints[${j}]`, `duplicate endpoint ${tag}`);
        tags.add(tag);
        const operations = operationsOf(provider.adapter);
        if (e.service_tier && !PROVIDER_FORMATS[provider.adapter].tiers[e.service_tier])
          fail(
            `${where}.endpoints[${j}].service_tier`,
            `${provider.adapter} providers have no tier "${e.service_tier}" (they have: ${Object.keys(PROVIDER_FORMATS[provider.adapter].tiers).join(', ') || 'none'})`,
          );
        if (m.kind === 'embedding' && !operations.includes('embeddings'))
          fail(`${where}.endpoints[${j}]`, `embedding models need an adapter that serves embeddings, ${e.provider} is ${provider.adapter}`);
        model.endpoints.push({ key: `${m.id}@${tag}`, tag, model, provider, entry: e, operations });
      }
      this.models.push(model);
      for (const name of [m.id, model.canonicalId, ...(m.aliases ?? [])]) {
        const taken = this.byId.get(name);
        if (taken && taken !== model) fail(where, `id or alias "${name}" is also used by ${taken.id}`);
        this.byId.set(name, model);
      }
    }
  }

  static fromObject(raw: unknown, env: Record<string, string | undefined> = {}, source = '(inline)'): Catalog {
    let file: CatalogFile;
    try {
      file = validateFile(raw);
    } catch (err) {
      if (err instanceof BadRequestError) {
        const first = (err.metadata?.errors as { field: string; message: string }[] | undefined)?.[0];
        throw new CatalogError(
          `Invalid catalog ${source}: ${first ? `${first.field.replace(/^body$/, '(root)')}: ${first.message}` : err.message}`,
        );
      }
      throw err;
    }
    return new Catalog(file, env, source);
  }

  static fromFile(file: string, env: Record<string, string | undefined>): Catalog {
    let raw: unknown;
    try {
      raw = JSON.parse(fs.readFileSync(file, 'utf8'));
    } catch (err) {
      throw new CatalogError(`Cannot read catalog ${file}: ${(err as Error).message}`);
    }
    return Catalog.fromObject(raw, env, path.relative(process.cwd(), file) || file);
  }

  /**
   * Resolves what a caller wrote to a model: bare ids into the default namespace, `~` and
   * `-latest` aliases to the family's newest version, dated ids, catalog aliases, and the
   * `:nitro` / `:floor` routing shortcuts and `:online` (the web plugin). Unknown → 404 naming the model.
   */
  resolve(requested: string): { model: CatalogModel; variant: ModelVariant } {
    let id = requested.trim();
    let variant: ModelVariant = null;
    const suffix = /:(nitro|floor|online)$/.exec(id);
    if (suffix) {
      variant = suffix[1] as ModelVariant;
      id = id.slice(0, suffix.index);
    }
    if (id.startsWith('~')) id = id.slice(1);
    const direct = this.byId.get(id) ?? (id.includes('/') ? undefined : this.byId.get(`${DEFAULT_NAMESPACE}/${id}`));
    if (direct) return { model: direct, variant };
    if (id.endsWith('-latest')) {
      const family = id.slice(0, -'-latest'.length);
      const full = family.includes('/') ? family : `${DEFAULT_NAMESPACE}/${family}`;
      const newest = this.models.filter((m) => m.family === full).sort((a, b) => compareVersions(b.version, a.version))[0];
      if (newest) return { model: newest, variant };
    }
    throw new NotFoundError(`Model ${JSON.stringify(requested)} not found`, { model: requested });
  }
}
