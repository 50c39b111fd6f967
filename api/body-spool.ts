// A large request body kept on disk while it arrives, as nginx keeps one past client_body_buffer_size:
// a batch body may be 200 MB and arrive as slowly as its client likes, and what it holds meanwhile
// should be a file, not the API process's memory.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { finished } from 'node:stream/promises';
import { ServiceUnavailableError } from '../infrastructure/errors';
import { processRunning } from '../infrastructure/processes';
import type { BodySink } from './body';

const PREFIX = 'inference-gateway-batch-bodies-';
/** A directory of ours, and the process id that made it. */
const OURS = new RegExp(`^${PREFIX}(\\d+)-`);

/**
 * A new directory of this process's own for bodies, under the system's temporary one. Those of
 * processes that are gone are removed first: a process that crashed left its bodies there.
 */
export function spoolDirectory(tmp = os.tmpdir()): string {
  for (const name of fs.readdirSync(tmp)) {
    const pid = Number(OURS.exec(name)?.[1]);
    if (pid && pid !== process.pid && !processRunning(pid)) fs.rmSync(path.join(tmp, name), { recursive: true, force: true });
  }
  return fs.mkdtempSync(path.join(tmp, `${PREFIX}${process.pid}-`));
}

const notStored = () => new ServiceUnavailableError('The request body could not be stored right now; try again');

/** A body as sent (still encoded, if it was): in memory up to `inMemoryBytes`, past that in a file of `dir`. */
export class SpooledBody implements BodySink {
  /** The pieces, while in memory; empty once written to the file. */
  chunks: Buffer[] = [];
  bytes = 0;
  /** The file holding it all, once past `inMemoryBytes`. */
  file: string | null = null;
  private out: fs.WriteStream | null = null;
  private failed = false;
  private resume: (() => void) | null = null;

  constructor(
    readonly dir: string,
    private readonly name: string,
    private readonly inMemoryBytes: number,
    readonly encoding: string,
  ) {}

  /** Still in memory, and as it is to be read (not compressed). */
  get readableInPlace(): boolean {
    return !this.file && this.encoding === 'identity';
  }

  take(chunk: Buffer): boolean {
    if (this.failed) throw notStored();
    this.bytes += chunk.length;
    if (this.out) return this.out.write(chunk);
    this.chunks.push(chunk);
    if (this.bytes <= this.inMemoryBytes) return true;
    this.file = path.join(this.dir, this.name);
    this.out = fs.createWriteStream(this.file, { flags: 'wx' });
    // A disk that is full (or gone) refuses the body rather than leaving its reader paused.
    this.out.on('error', () => {
      this.failed = true;
      const resume = this.resume;
      this.resume = null;
      resume?.();
    });
    let more = true;
    for (const c of this.chunks) more = this.out.write(c);
    this.chunks = [];
    return more;
  }

  onDrain(resume: () => void): void {
    this.resume = resume;
    this.out!.once('drain', () => {
      if (this.resume === resume) this.resume = null;
      resume();
    });
  }

  async end(): Promise<void> {
    if (!this.out) return;
    try {
      await finished(this.out.end());
    } catch {
      throw notStored();
    }
    if (this.failed) throw notStored();
  }

  /** Removes its file, if it has one; done with it either way. */
  discard(): void {
    this.chunks = [];
    this.out?.destroy();
    if (this.file) fs.rm(this.file, { force: true }, () => undefined);
  }
}
