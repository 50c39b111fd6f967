// The files that measure a gateway's event-loop turns (.mocharc.cjs), run after the others with
// the machine to themselves: one process, one file at a time, services of their own.
const { alone, parallel: _parallel, jobs: _jobs, spec: _spec, ...shared } = require('./.mocharc.cjs');

module.exports = { ...shared, spec: alone };
