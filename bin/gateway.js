#!/usr/bin/env node
// Thin launcher for the compiled CLI (npm run build writes dist/).
const path = require('node:path');
const fs = require('node:fs');
const entry = path.join(__dirname, '..', 'dist', 'cli', 'index.js');
if (!fs.existsSync(entry)) {
  process.stderr.write('gateway: not built yet; run `npm run build` (npm start and npm test build it too)\n');
  process.exit(1);
}
require(entry)
  .buildProgram()
  .parseAsync(process.argv)
  .catch((err) => {
    process.stderr.write(`gateway: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  });
