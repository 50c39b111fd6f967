// Lint rules that guard the layout by layer: dependencies point one way,
//   cli → api → domain → infrastructure            (activities/workflows/worker wrap domain for Temporal)
// so nothing below the HTTP layer imports api/ or cli/, the domain imports neither the Temporal
// layer nor Temporal or Koa themselves, the infrastructure knows no domain, nothing in the product
// imports the embedded dev stack, and no module takes part in an import cycle.
import tseslint from 'typescript-eslint';
import importX from 'eslint-plugin-import-x';
import fs from 'node:fs';

/** Everything below the HTTP layer. */
const belowApi = ['domain', 'infrastructure', 'activities', 'workflows', 'worker', 'devstack'];
const temporalLayer = ['./activities', './workflows', './worker'];

const zone = (target, from, message) => ({ target, from, message });
const zones = [
  ...belowApi.flatMap((dir) => [
    zone(`./${dir}`, './api', 'Code below the HTTP layer must not depend on api/: move what it needs below it.'),
    zone(`./${dir}`, './cli', 'Only the command line starts processes; nothing it starts imports it.'),
  ]),
  ...['./domain', './infrastructure', './api'].map((target) =>
    zone(target, './devstack', 'The product must not depend on the embedded dev stack (sandbox, local services).'),
  ),
  ...temporalLayer.map((from) => zone('./domain', from, 'Domain services must not depend on the Temporal layer; it wraps them.')),
  zone('./infrastructure', './domain', 'Infrastructure must not depend on the domain: pass what it needs in.'),
  // The Temporal client adapter (infrastructure/temporal) names the workflows it starts; no other infrastructure does.
  ...fs
    .readdirSync('infrastructure')
    .filter((dir) => dir !== 'temporal')
    .flatMap((dir) =>
      temporalLayer.map((from) => zone(`./infrastructure/${dir}`, from, 'Infrastructure must not depend on the Temporal layer.')),
    ),
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
      'import-x/no-restricted-paths': ['error', { zones }],
      'import-x/no-cycle': ['error', { ignoreExternal: true }],
    },
  },
  {
    // Domain modules hold the business rules; Temporal's and Koa's types stay in the layers that adapt
    // them (activities/, workflows/, worker/, infrastructure/temporal/, api/), so a rule can be tested without either.
    files: ['domain/**/*.ts', 'infrastructure/**/*.ts'],
    ignores: ['infrastructure/temporal/**'],
    rules: {
      'no-restricted-imports': [
        'error',
        { patterns: [{ group: ['@temporalio/*', 'koa', '@koa/*'], message: 'Domain code must not depend on Temporal or Koa.' }] },
      ],
    },
  },
];
