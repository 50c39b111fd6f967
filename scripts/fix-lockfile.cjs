#!/usr/bin/env node
// The npm registry reachable from our machines serves only Linux builds of some native packages
// (for example @swc/core-darwin-arm64 is missing), so `npm install` leaves those optional
// dependencies out of package-lock.json and `npm ci` then calls the lock file out of sync.
// This adds an entry for each, with the os/cpu its name states, which `npm ci` skips on other
// platforms exactly as it would a real entry. Run it after `npm install` changes the lock file.
const fs = require('node:fs');
const path = require('node:path');

const file = path.join(__dirname, '..', 'package-lock.json');
const lock = JSON.parse(fs.readFileSync(file, 'utf8'));
const OS = ['darwin', 'linux', 'win32', 'freebsd', 'android', 'openbsd', 'sunos', 'aix', 'openharmony'];
const CPU = ['arm64', 'x64', 'ia32', 'arm', 'ppc64', 's390x', 'riscv64', 'loong64', 'mips64el'];

let added = 0;
for (const [where, entry] of Object.entries(lock.packages)) {
  for (const [name, range] of Object.entries(entry.optionalDependencies ?? {})) {
    const key = `node_modules/${name}`;
    const nested = where ? `${where}/node_modules/${name}` : key;
    if (lock.packages[key] || lock.packages[nested]) continue;
    const tokens = name.split('/').pop().split('-');
    const os = OS.find((o) => tokens.includes(o));
    const cpu = CPU.find((c) => tokens.includes(c));
    if (!os || !cpu) {
      console.warn(`fix-lockfile: cannot tell the platform of ${name}; left out`);
      continue;
    }
    lock.packages[key] = { version: String(range).replace(/^[\^~=]/, ''), cpu: [cpu], optional: true, os: [os] };
    added++;
  }
}
lock.packages = Object.fromEntries(Object.entries(lock.packages).sort(([a], [b]) => (a === '' ? -1 : b === '' ? 1 : a.localeCompare(b))));
fs.writeFileSync(file, `${JSON.stringify(lock, null, 2)}\n`);
console.log(`fix-lockfile: ${added} platform entries added`);
