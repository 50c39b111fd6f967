// The suite against the real stack: one set of services for the whole run (test/fixture.ts), the
// test files spread over three worker processes (they spend much of their time waiting on
// processes, timers and the services, so three keep two cores busy). The longest files start
// first, so that no worker is left running one of them alone at the end.
const fs = require('node:fs');

const dir = 'dist/test';
// Longest first, as measured alone (faults ~41 s, batches and cli ~35 s, then 15 s down to 7 s).
const longest = [
  'faults',
  'batches',
  'cli',
  'cli-batches',
  'webhooks',
  'upstream',
  'hot-path',
  'fuzz',
  'accounts',
  'decisions',
  'health',
  'inference',
  'metrics',
].map((n) => `${dir}/${n}.test.js`);
// Files whose tests bound the longest event-loop turn of a gateway in milliseconds: run after the
// others, one at a time (.mocharc.alone.cjs). Beside two other workers on two cores a gateway's
// turn includes the time it waits for a core: a full run measured 119-152 ms against a bound of
// 100 for a batch create that takes 21-43 ms alone.
const alone = ['hostile-input'].map((n) => `${dir}/${n}.test.js`);
const all = fs
  .readdirSync(dir)
  .filter((f) => f.endsWith('.test.js'))
  .map((f) => `${dir}/${f}`)
  .filter((f) => !alone.includes(f));

module.exports = {
  alone,
  spec: [...longest.filter((f) => all.includes(f)), ...all.filter((f) => !longest.includes(f))],
  require: [`${dir}/fixture.js`],
  parallel: true,
  jobs: 3,
  timeout: 60_000,
  exit: true,
  'enable-source-maps': true,
};
