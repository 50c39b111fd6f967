// Catalog entries as a catalog file holds them, with the fields most entries share filled in: for
// benchmarks and tests that add their own providers and models to the default catalog.

export interface ProviderEntry {
  slug: string;
  name: string;
  adapter: 'openai' | 'anthropic' | 'systemone';
  base_url: string;
  collects_data: boolean;
  zdr: boolean;
  max_concurrency: number;
  timeout_ms: number;
}

export interface EndpointEntry {
  provider: string;
  upstream_model: string;
  pricing: { prompt: number; completion: number };
  quantization: string;
  supported_parameters: string[];
}

export function providerEntry(slug: string, baseUrl: string, over: Partial<ProviderEntry> = {}): ProviderEntry {
  return {
    slug,
    name: slug,
    adapter: 'openai',
    base_url: baseUrl,
    collects_data: false,
    zdr: false,
    max_concurrency: 50,
    timeout_ms: 5000,
    ...over,
  };
}

/** An endpoint of `provider`, `price` USD per million tokens in and out unless `over` says otherwise. */
export function endpointEntry(provider: string, price = 1, over: Partial<EndpointEntry> = {}): EndpointEntry {
  return {
    provider,
    upstream_model: `${provider}-model`,
    pricing: { prompt: price, completion: price },
    quantization: 'bf16',
    supported_parameters: [],
    ...over,
  };
}

export function modelEntry(id: string, endpoints: EndpointEntry[], over: Record<string, unknown> = {}) {
  return {
    id,
    name: id,
    kind: 'chat',
    family: id,
    version: '1',
    released: '20260101',
    context_length: 8192,
    distillable: true,
    endpoints,
    ...over,
  };
}
