// A local append-only journal of usage records, so a synchronous call can be answered as soon as
// its bill is safe from a crash of this process, without waiting for a database round trip: its
// line in one write(2) with the others of its event-loop turn (microseconds), instead of an insert
// (0.3-0.6 ms on the embedded FerretDB).
// The usage ledger then writes the records to the database in groups and confirms them here.
//
// A stream in progress also journals checkpoints: what it has produced so far, as the usage record
// it would be billed if it ended now. A checkpoint never goes to the database from a live process
// (the stream's own record supersedes it); a dead process's checkpoints are billed by the adopter
// for each stream whose final record is not in the journal, so a stream cut by a crash is billed
// for what it produced, as one whose client went away is.
//
// Files, in one directory that may be shared by several processes (a volume):
//   <instance>.alive         this process is alive: {pid, host, database}; touched every few seconds
//   <instance>.<n>.ndjson    segments of records in Extended JSON, one per line; a segment is deleted
//                            once every record in it is in the database
// A process that dies leaves its files. Another process (or the next start on the same host, at
// once) adopts the segments of a dead instance of the same database: renames them to its own name
// (atomic, so only one adopter wins) and writes their records. Records are keyed by generation id,
// so a record written twice (adopted after all, or written before a crash) is stored once.
//
// Durability is that of the page cache: a record survives this process crashing or being killed,
// not the machine losing power, the same trade as the embedded FerretDB's `synchronous=normal`.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { BSON } from 'mongodb';
import type { UsageDoc } from '../../infrastructure/store';
import { processRunning } from '../../infrastructure/processes';
import { withFields } from '../../infrastructure/objects/with-fields';

/** Records per segment before the next one is started. */
const SEGMENT_RECORDS = 1_000;
/** How often a live process touches its `.alive` file. */
const ALIVE_EVERY_MS = 5_000;
/** An instance whose `.alive` file is older than this is dead. */
const STALE_MS = 30_000;

/** Marks a checkpoint's line. */
const CHECKPOINT = '_checkpoint';

/** True for a checkpoint read back from a journal (the marker is removed). */
export function takeCheckpointMark(doc: UsageDoc): boolean {
  if (!(CHECKPOINT in doc)) return false;
  delete (doc as Record<string, unknown>)[CHECKPOINT];
  return true;
}

/**
 * A record's line: relaxed Extended JSON, as `EJSON.parse` reads it back. Written by hand because a
 * usage record's one value JSON has no form for is its `created_at` date, and `EJSON.stringify`
 * cost three times as much on every synchronous call's path.
 */
export function journalLine(doc: UsageDoc, checkpoint = false): string {
  const line = withFields(doc, { created_at: { $date: doc.created_at.toISOString() }, ...(checkpoint && { [CHECKPOINT]: true }) });
  return `${JSON.stringify(line)}\n`;
}

/** Instances open in this process: never adopted by another journal of the same process (tests). */
const openHere = new Set<string>();

export interface Segment {
  file: string;
  fd: number | null;
  records: number;
  /** Records not yet confirmed in the database; a closed segment is deleted at 0. */
  unconfirmed: number;
}

interface AliveInfo {
  pid: number;
  host: string;
  database: string;
}

interface Waiting {
  line: string;
  resolve: (segment: Segment) => void;
  reject: (err: unknown) => void;
}

export class UsageJournal {
  readonly instance = randomBytes(6).toString('hex');
  /** write(2) calls made, for tests: lines of one turn of the event loop share one. */
  writes = 0;
  private current: Segment | null = null;
  /** Lines of this turn of the event loop, written together once it is over (`appendSoon`). */
  private waiting: Waiting[] = [];
  private next = 0;
  private readonly alivePath: string;
  private readonly toucher: NodeJS.Timeout;

  constructor(
    readonly dir: string,
    private readonly database: string,
  ) {
    fs.mkdirSync(dir, { recursive: true });
    this.alivePath = path.join(dir, `${this.instance}.alive`);
    const info: AliveInfo = { pid: process.pid, host: os.hostname(), database };
    fs.writeFileSync(this.alivePath, JSON.stringify(info));
    openHere.add(this.instance);
    this.toucher = setInterval(() => {
      const now = new Date();
      fs.utimes(this.alivePath, now, now, () => undefined);
    }, ALIVE_EVERY_MS).unref();
  }

  /**
   * Writes the record's line; once this returns, the record survives this process dying. A
   * checkpoint (see above) holds its segment like an unconfirmed record until it is released
   * with `confirm`, when a newer checkpoint or the stream's own record has been written.
   */
  append(doc: UsageDoc, checkpoint = false): Segment {
    return this.write(journalLine(doc, checkpoint), 1);
  }

  /**
   * Writes a record's line (`journalLine`) together with the others appended in this turn of the event loop:
   * resolves once it is written, as `append` returns. Under load many calls finish in one turn,
   * and one write(2) for all of them costs a fraction of one each (it was 4% of the API's CPU at
   * c=50); a lone call waits only for the end of its turn.
   */
  appendSoon(line: string): Promise<Segment> {
    return new Promise((resolve, reject) => {
      if (!this.waiting.length) setImmediate(() => this.writeWaiting());
      this.waiting.push({ line, resolve, reject });
    });
  }

  private writeWaiting(): void {
    const batch = this.waiting;
    if (!batch.length) return;
    this.waiting = [];
    let segment: Segment;
    try {
      segment = this.write(batch.map((w) => w.line).join(''), batch.length);
    } catch (err) {
      for (const w of batch) w.reject(err);
      return;
    }
    for (const w of batch) w.resolve(segment);
  }

  private write(text: string, records: number): Segment {
    if (!this.current) {
      const file = path.join(this.dir, `${this.instance}.${this.next++}.ndjson`);
      this.current = { file, fd: fs.openSync(file, 'a'), records: 0, unconfirmed: 0 };
    }
    const segment = this.current;
    const bytes = Buffer.from(text);
    // A regular file takes a whole write unless it fails (a full disk): then the next call throws.
    try {
      for (let at = 0; at < bytes.length;) at += fs.writeSync(segment.fd!, bytes, at);
    } catch (err) {
      // Part of the text may be in the file: later lines go to a new segment, not after a cut line.
      this.closeSegment(segment);
      throw err;
    }
    this.writes++;
    segment.records += records;
    segment.unconfirmed += records;
    if (segment.records >= SEGMENT_RECORDS) this.closeSegment(segment);
    return segment;
  }

  /** A record of `segment` is in the database. */
  confirm(segment: Segment): void {
    segment.unconfirmed--;
    if (segment.fd === null && segment.unconfirmed === 0) fs.rmSync(segment.file, { force: true });
  }

  private closeSegment(segment: Segment): void {
    if (segment.fd !== null) fs.closeSync(segment.fd);
    segment.fd = null;
    if (this.current === segment) this.current = null;
    if (segment.unconfirmed === 0) fs.rmSync(segment.file, { force: true });
  }

  /**
   * Takes over the segments of dead instances of this database. Each comes back as a segment of
   * ours (closed, so it is deleted once its records are confirmed) with the records it holds.
   */
  adoptOrphans(onBadLine: (file: string, line: number) => void): { segment: Segment; docs: UsageDoc[] }[] {
    const adopted: { segment: Segment; docs: UsageDoc[] }[] = [];
    const names = fs.readdirSync(this.dir); // one listing per scan, however many instances died
    for (const name of names) {
      if (!name.endsWith('.alive')) continue;
      const instance = name.slice(0, -'.alive'.length);
      if (instance === this.instance || openHere.has(instance) || !this.isDead(path.join(this.dir, name))) continue;
      for (const seg of names.filter((f) => f.startsWith(`${instance}.`) && f.endsWith('.ndjson'))) {
        const file = path.join(this.dir, `${this.instance}.adopted-${seg}`);
        try {
          fs.renameSync(path.join(this.dir, seg), file);
        } catch {
          continue; // another process adopted it first
        }
        const docs = readSegment(file, onBadLine);
        const segment: Segment = { file, fd: null, records: docs.length, unconfirmed: docs.length };
        if (docs.length) adopted.push({ segment, docs });
        else fs.rmSync(file, { force: true });
      }
      fs.rmSync(path.join(this.dir, name), { force: true });
    }
    return adopted;
  }

  private isDead(alivePath: string): boolean {
    let info: AliveInfo;
    let mtime: number;
    try {
      info = JSON.parse(fs.readFileSync(alivePath, 'utf8')) as AliveInfo;
      mtime = fs.statSync(alivePath).mtimeMs;
    } catch {
      return false; // being written or removed right now
    }
    if (info.database !== this.database) return false;
    if (Date.now() - mtime > STALE_MS) return true;
    // On this host a dead process is known at once: no such pid, or our own (an earlier run of us).
    return info.host === os.hostname() && (info.pid === process.pid || !processRunning(info.pid));
  }

  /** Stops journaling. Segments with unconfirmed records stay for the next start to adopt. */
  close(): void {
    this.writeWaiting();
    clearInterval(this.toucher);
    if (this.current) this.closeSegment(this.current);
    openHere.delete(this.instance);
    const left = fs.readdirSync(this.dir).some((f) => f.startsWith(`${this.instance}.`) && f.endsWith('.ndjson'));
    // Without its `.alive` file a leftover segment would have no owner to be adopted from.
    if (!left) fs.rmSync(this.alivePath, { force: true });
  }
}

function readSegment(file: string, onBadLine: (file: string, line: number) => void): UsageDoc[] {
  const docs: UsageDoc[] = [];
  fs.readFileSync(file, 'utf8')
    .split('\n')
    .forEach((line, i) => {
      if (!line) return;
      try {
        docs.push(BSON.EJSON.parse(line, { relaxed: true }) as UsageDoc);
      } catch {
        onBadLine(file, i + 1); // a line torn by a power loss
      }
    });
  return docs;
}
