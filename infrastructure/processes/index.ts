// Whether a process of this host is still running: what lets a process take over (or remove) what
// a stopped one left behind, its usage journal or its batch bodies on disk.

/** True while `pid` runs (EPERM: it runs, as another user). */
export function processRunning(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}
