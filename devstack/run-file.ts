// What a `gateway start` left running, recorded in DATA_DIR/run.json: its own pid and each child's
// (the command itself, not its watchdog). A start reads it first: children of a run whose gateway
// is gone (killed with SIGKILL, say, a moment ago) are still dying, or hold their ports and data
// files; they are stopped and waited for before anything starts, so the new run never talks to a
// process of the old one. A run whose gateway is still alive is another gateway: refused.
import fs from 'node:fs';
import path from 'node:path';

interface RunFile {
  pid: number;
  children: Record<string, { pid: number; command: string }>;
}

function commandLine(pid: number): string | null {
  try {
    return fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ');
  } catch {
    return null; // gone (or not Linux: then nothing is known to be left)
  }
}

/** True while `pid` runs a command whose command line contains `command`. */
function running(pid: number, command: string): boolean {
  return commandLine(pid)?.includes(command) ?? false;
}

export class RunRecord {
  private readonly file: string;
  private readonly run: RunFile = { pid: process.pid, children: {} };

  constructor(dataDir: string) {
    this.file = path.join(dataDir, 'run.json');
  }

  /**
   * Stops what an earlier run left behind, and waits until it is gone (SIGTERM, then SIGKILL
   * after `graceMs`). Throws when the earlier run's gateway is still alive.
   */
  async clearLeftovers(graceMs = 5_000): Promise<string[]> {
    let before: RunFile;
    try {
      before = JSON.parse(fs.readFileSync(this.file, 'utf8')) as RunFile;
    } catch {
      return [];
    }
    if (before.pid !== process.pid && running(before.pid, 'start')) {
      throw new Error(`another gateway (pid ${before.pid}) is running with this DATA_DIR (${path.dirname(this.file)}): stop it first`);
    }
    const left = Object.entries(before.children ?? {}).filter(([, c]) => running(c.pid, c.command));
    for (const [, c] of left) signal(c.pid, 'SIGTERM');
    const deadline = Date.now() + graceMs;
    let killed = false;
    while (left.some(([, c]) => running(c.pid, c.command))) {
      if (!killed && Date.now() > deadline) {
        for (const [, c] of left) signal(c.pid, 'SIGKILL');
        killed = true;
      }
      if (Date.now() > deadline + graceMs)
        throw new Error(`processes of an earlier run would not stop: ${left.map(([n, c]) => `${n} (${c.pid})`).join(', ')}`);
      await new Promise((r) => setTimeout(r, 50));
    }
    return left.map(([name, c]) => `${name} (pid ${c.pid})`);
  }

  /** Records a child (again, when it is restarted under a new pid). */
  child(name: string, pid: number | undefined, command: string): void {
    if (pid === undefined) return;
    this.run.children[name] = { pid, command };
    fs.mkdirSync(path.dirname(this.file), { recursive: true });
    fs.writeFileSync(`${this.file}.tmp`, JSON.stringify(this.run));
    fs.renameSync(`${this.file}.tmp`, this.file);
  }

  /** A clean stop leaves nothing to clear. */
  remove(): void {
    fs.rmSync(this.file, { force: true });
  }
}

function signal(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
  } catch {
    // gone already
  }
}
