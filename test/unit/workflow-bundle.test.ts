// The workflow bundle is built once and kept under a hash of the workflow files: a later process
// reads it, and an edited workflow gets a bundle of its own rather than a stale one.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { expect } from 'chai';

describe('workflow bundle cache', function () {
  this.timeout(60_000);
  // A copy of the compiled worker and workflows inside dist/, so that node_modules still resolves.
  const root = path.resolve(__dirname, '..', '..', `.bundle-test-${process.pid}`);
  const cache = path.join(root, '.cache');
  const load = () =>
    execFileSync(process.execPath, ['-e', `require(${JSON.stringify(path.join(root, 'worker', 'bundle.js'))}).workflowBundle()`], {
      stdio: 'pipe',
    });
  const cached = () => fs.readdirSync(cache).filter((f) => /^workflows-[0-9a-f]{16}\.js$/.test(f));

  before(() => {
    for (const dir of ['worker', 'workflows']) {
      fs.mkdirSync(path.join(root, dir), { recursive: true });
      const from = path.resolve(__dirname, '..', '..', dir);
      for (const f of fs.readdirSync(from).filter((f) => f.endsWith('.js'))) fs.copyFileSync(path.join(from, f), path.join(root, dir, f));
    }
  });
  after(() => fs.rmSync(root, { recursive: true, force: true }));

  it('bundles once, then reads the bundle; an edited workflow gets a new one', () => {
    load();
    const [first] = cached();
    expect(fs.readFileSync(path.join(cache, first), 'utf8')).to.include('batchWorkflow');
    const writtenAt = fs.statSync(path.join(cache, first)).mtimeMs;
    load();
    expect(cached()).to.deep.equal([first]);
    expect(fs.statSync(path.join(cache, first)).mtimeMs).to.equal(writtenAt);

    fs.appendFileSync(path.join(root, 'workflows', 'self-check.js'), '\n// edited\n');
    load();
    const after = cached();
    expect(after).to.have.length(2);
    const second = after.find((f) => f !== first)!;
    expect(fs.readFileSync(path.join(cache, second), 'utf8')).to.include('// edited');
  });
});
