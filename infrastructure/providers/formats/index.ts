// The provider wire formats a catalog entry can name as its `adapter`. A new format is one module
// implementing ProviderFormat, added here.
import { anthropic } from './anthropic';
import type { Operation, ProviderFormat } from './format';
import { openai } from './openai';
import { systemone } from './systemone';

export type { Operation, ProviderFormat, Usage } from './format';

export const PROVIDER_FORMATS = { openai, anthropic, systemone } satisfies Record<string, ProviderFormat>;

export type FormatName = keyof typeof PROVIDER_FORMATS;

export const FORMAT_NAMES = Object.keys(PROVIDER_FORMATS) as FormatName[];

/** The operations a format serves. */
export function operationsOf(format: FormatName): Operation[] {
  return Object.keys(PROVIDER_FORMATS[format].paths) as Operation[];
}
