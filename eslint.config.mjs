// Lint rules that guard the structure: dependencies point one way (api → domain → store/providers),
// so nothing below the HTTP layer imports from api/, no domain module imports Temporal or Koa, and
// no module takes part in an import cycle.
import tseslint from 'typescript-eslint';
import importX from 'eslint-plugin-import-x';

const domain = [
  'accounts',
  'activities',
  'batches',
  'catalog',
  'concurrency',
  'config',
  'decisions',
  'errors',
  'inference',
  'log',
  'metrics',
  'webhooks',
  'presets',
  'providers',
  'routing',
  'sandbox',
  'schemas',
  'store',
  'temporal',
  'tools',
  'worker',
  'workflows',
];

export default [
  { ignores: ['dist/**', 'node_modules/**', '**/*.js', '**/*.cjs', '**/*.mjs'] },
  {
    files: ['**/*.ts'],
    languageOptions: { parser: tseslint.parser, parserOptions: { ecmaVersion: 2022, sourceType: 'module' } },
    plugins: { 'import-x': importX },
    settings: {
      'import-x/resolver-next': [importX.createNodeResolver({ extensions: ['.ts', '.js', '.json'] })],
      'import-x/extensions': ['.ts', '.js'],
      'import-x/parsers': { '@typescript-eslint/parser': ['.ts'] },
    },
    rules: {
      'import-x/no-restricted-paths': [
        'error',
        {
          zones: domain.map((dir) => ({
            target: `./${dir}`,
            from: './api',
            message: 'Domain code must not depend on the HTTP layer (api/): move what it needs below it.',
          })),
        },
      ],
      'import-x/no-cycle': ['error', { ignoreExternal: true }],
    },
  },
  {
    // Domain modules hold the business rules; Temporal's and Koa's types stay in the layers that adapt
    // them (activities/, workflows/, worker/, temporal/, api/), so a rule can be tested without either.
    files: domain
      .filter((d) => !['activities', 'temporal', 'worker', 'workflows', 'tools', 'sandbox'].includes(d))
      .map((d) => `${d}/**/*.ts`),
    rules: {
      'no-restricted-imports': [
        'error',
        { patterns: [{ group: ['@temporalio/*', 'koa', '@koa/*'], message: 'Domain code must not depend on Temporal or Koa.' }] },
      ],
    },
  },
];
