// The workflow code as one bundle. Bundling (webpack) costs about a second of CPU, so it happens
// once per process and is kept on disk under a hash of the workflow files and the SDK version:
// every later process (a restarted worker, each `gateway` start) reads it instead, and an edited
// workflow gets a new hash, never a stale bundle.
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { bundleWorkflowCode, Runtime, type WorkflowBundle } from '@temporalio/worker';

const workflowsPath = require.resolve('../workflows');
let bundle: Promise<WorkflowBundle> | null = null;

function bundleFile(): string {
  const dir = path.dirname(workflowsPath);
  const hash = createHash('sha256');
  hash.update(require('@temporalio/workflow/package.json').version);
  for (const f of fs
    .readdirSync(dir)
    .filter((f) => f.endsWith('.js'))
    .sort())
    hash.update(f).update(fs.readFileSync(path.join(dir, f)));
  return path.join(dir, '..', '.cache', `workflows-${hash.digest('hex').slice(0, 16)}.js`);
}

async function load(): Promise<WorkflowBundle> {
  const file = bundleFile();
  try {
    return { code: fs.readFileSync(file, 'utf8') };
  } catch {
    // not built yet
  }
  const built = await bundleWorkflowCode({ workflowsPath, logger: Runtime.instance().logger });
  try {
    // Written whole, then renamed: a process starting meanwhile never reads half a bundle.
    fs.mkdirSync(path.dirname(file), { recursive: true });
    const tmp = `${file}.${process.pid}.tmp`;
    fs.writeFileSync(tmp, built.code);
    fs.renameSync(tmp, file);
  } catch {
    // A read-only install bundles in each process; nothing else changes.
  }
  return built;
}

export function workflowBundle(): Promise<WorkflowBundle> {
  bundle ??= load();
  return bundle;
}
