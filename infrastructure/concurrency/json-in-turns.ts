// JSON of many megabytes parsed and serialised in turns of the event loop. V8 parses and
// serialises a text whole: 30 MB of embeddings as floats took 140-240 ms each way in one turn,
// and encoding the text as many again, holding every other request of the process meanwhile.
// The large answers providers send are a root object whose bulk is an array of many elements
// (`data`, `choices`, `content`), so the work is split at that array's elements; a text or value
// of any other shape goes whole, as before.
import { randomBytes } from 'node:crypto';
import { nextTurn, TURN_SPLIT_BYTES } from './next-turn';

/** Texts joined into pieces of about TURN_SPLIT_BYTES characters, with a turn after each piece. */
class Pieces {
  private readonly done: string[] = [];
  private parts: string[] = [];
  private size = 0;

  async add(text: string): Promise<void> {
    this.parts.push(text);
    this.size += text.length;
    if (this.size < TURN_SPLIT_BYTES) return;
    this.done.push(this.parts.join(''));
    this.parts = [];
    this.size = 0;
    await nextTurn();
  }

  /** Every piece, the last one included. */
  end(): string[] {
    if (this.parts.length) this.done.push(this.parts.join(''));
    this.parts = [];
    return this.done;
  }
}

/**
 * Chunks of UTF-8 as text in pieces of about TURN_SPLIT_BYTES, a turn after each (a character
 * may span two chunks). `fatal`: an invalid sequence throws a TypeError rather than becoming U+FFFD.
 */
export async function utf8Pieces(chunks: Buffer[], fatal: boolean): Promise<string[]> {
  const decoder = new TextDecoder('utf-8', { fatal });
  const pieces = new Pieces();
  for (const chunk of chunks) await pieces.add(decoder.decode(chunk, { stream: true }));
  await pieces.add(decoder.decode());
  return pieces.end();
}

/** A text given in pieces, read by position as one. */
class PiecedText {
  private readonly offsets: number[] = [];
  readonly length: number;

  constructor(readonly pieces: string[]) {
    let at = 0;
    for (const p of pieces) {
      this.offsets.push(at);
      at += p.length;
    }
    this.length = at;
  }

  /** Characters [from, to) as one string. */
  slice(from: number, to: number): string {
    const parts: string[] = [];
    for (let i = this.pieceAt(from); i < this.pieces.length && this.offsets[i] < to; i++) {
      const base = this.offsets[i];
      parts.push(this.pieces[i].slice(Math.max(0, from - base), Math.min(this.pieces[i].length, to - base)));
    }
    return parts.join('');
  }

  private pieceAt(position: number): number {
    let lo = 0;
    let hi = this.pieces.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (this.offsets[mid] <= position) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  }
}

/** An object or array this long or longer is parsed a group of members at a time. */
export const GROUP_CHARS = 64 * 1024;
/** How long the work goes on before it takes a turn of the event loop. */
const TURN_MS = 20;
/** Open containers the scan keeps track of at most; a text nested deeper is parsed whole. */
const MOST_FRAMES = 4_096;
/** A string spelling `__proto__`, escapes included (as @hapi/bourne looks for it). */
const PROTO_KEY =
  /^(?:_|\\u005[Ff])(?:_|\\u005[Ff])(?:p|\\u0070)(?:r|\\u0072)(?:o|\\u006[Ff])(?:t|\\u0074)(?:o|\\u006[Ff])(?:_|\\u005[Ff])(?:_|\\u005[Ff])$/;

/** What a request body may not hold; a text that does is refused with a ShapeError. */
export interface ShapeLimits {
  /** Objects and arrays nested deeper than this. */
  maxDepth?: number;
  /** A `__proto__` key anywhere. */
  refuseProtoKeys?: boolean;
  /**
   * An array or object of more members than this (counted in those of GROUP_CHARS or more). An
   * array of millions of numbers cost more to grow than to parse: 177 ms in one turn for 4.9 million.
   */
  maxMembers?: number;
}

export class ShapeError extends Error {
  constructor(readonly reason: 'depth' | 'proto' | 'members') {
    super(
      { depth: 'JSON nests too deep', proto: 'JSON holds a __proto__ key', members: 'JSON has a container of too many members' }[reason],
    );
  }
}

/**
 * An object or array of GROUP_CHARS or more: the commas its groups of members end at, and the
 * containers of GROUP_CHARS or more among its members, each parsed on its own.
 */
interface Container {
  array: boolean;
  /** A string of GROUP_CHARS or more among a container's members (or keys): `open` and `close` are its quotes. */
  string?: boolean;
  /** Where its bracket opens and closes. */
  open: number;
  close: number;
  /** The first comma of its own GROUP_CHARS or more past the last (or its bracket). */
  cuts: number[];
  children: Container[];
}

/** Takes a turn of the event loop once the work has gone on for TURN_MS. */
class Clock {
  private since = performance.now();

  due(): boolean {
    return performance.now() - this.since >= TURN_MS;
  }

  async turn(): Promise<void> {
    await nextTurn();
    this.since = performance.now();
  }
}

const syntaxError = (what: string) => new SyntaxError(`${what} in JSON`);

/** How many backslashes come right before `at`, not looking before `from`. */
function slashesBefore(piece: string, at: number, from: number): number {
  let n = 0;
  while (at - 1 - n >= from && piece.charCodeAt(at - 1 - n) === 92 /* \ */) n++;
  return n;
}

/** The first character other than JSON whitespace at or after `from`, or -1. */
function nonSpaceAt(text: PiecedText, from: number): number {
  const rx = /[^\x20\t\n\r]/g;
  for (let at = from; at < text.length; at += GROUP_CHARS) {
    const m = rx.exec(text.slice(at, Math.min(text.length, at + GROUP_CHARS)));
    if (m) return at + m.index;
    rx.lastIndex = 0;
  }
  return -1;
}

/**
 * The root object or array as a Container, found by a scan that takes turns (TURN_MS) and checks
 * `limits`; null when the root is not an object or array, or nests past MOST_FRAMES (the caller
 * parses the whole). Brackets that do not match and unterminated strings are a SyntaxError.
 * Regular expressions skip to the next string, bracket, or (once a container's group is long
 * enough) comma natively: a loop over each character of 30 MB took ~140 ms.
 */
async function scan(text: PiecedText, clock: Clock, limits: ShapeLimits): Promise<Container | null> {
  const begin = nonSpaceAt(text, 0);
  if (begin < 0 || !'[{'.includes(text.slice(begin, begin + 1))) return null;
  const outStop = /["[\]{}]/g;
  /** `opened`: members seen to open here (an array's strings and containers, an object's containers), for maxMembers. */
  const stack: (Container & { lastCut: number; opened: number })[] = [];
  const most = limits.maxMembers ?? Infinity;
  /** Where the strings spelling `__proto__` end: keys, if a colon follows. */
  const protoEnds: number[] = [];
  let root: Container | null = null;
  let inString = false;
  let escaped = false;
  let stringStart = -1;
  let stops = 0;
  let base = 0;
  scanning: for (const piece of text.pieces) {
    let i = Math.max(0, begin - base);
    /** The next string or bracket at or after `i`, once looked for. */
    let ahead = -1;
    while (i < piece.length) {
      if (++stops % 1_024 === 0 && clock.due()) await clock.turn();
      if (escaped) {
        escaped = false;
        i++;
        continue;
      }
      if (inString) {
        // The closing quote is the next one after an even run of backslashes: found natively, not
        // by stopping at each escape (a conversation's `\n`s made the scan 3-4 times a parse).
        let q = piece.indexOf('"', i);
        while (q >= 0 && slashesBefore(piece, q, i) % 2 === 1) q = piece.indexOf('"', q + 1);
        if (q < 0) {
          escaped = slashesBefore(piece, piece.length, i) % 2 === 1; // the next piece's first character
          break;
        }
        i = q + 1;
        inString = false;
        const length = base + q - stringStart - 1;
        if (length >= GROUP_CHARS)
          stack[stack.length - 1].children.push({
            array: false,
            string: true,
            open: stringStart,
            close: base + q,
            cuts: [],
            children: [],
          });
        if (limits.refuseProtoKeys && length >= 9 && length <= 54 && PROTO_KEY.test(text.slice(stringStart + 1, base + q)))
          protoEnds.push(base + i);
        continue;
      }
      // The next stop found before a cut is still ahead: not searched for again (an array of
      // numbers has none until its end, and a search per cut was 150 of its 10 MB).
      if (ahead < i) {
        outStop.lastIndex = i;
        ahead = outStop.exec(piece)?.index ?? piece.length;
      }
      const next = ahead;
      const top = stack[stack.length - 1];
      // Between here and `next` there are only the innermost container's own commas, and values.
      const from = top ? Math.max(i, top.lastCut + GROUP_CHARS - base) : next;
      if (from < next) {
        const comma = piece.indexOf(',', from);
        if (comma >= 0 && comma < next) {
          top.cuts.push((top.lastCut = base + comma));
          i = comma + 1;
          continue;
        }
      }
      if (next === piece.length) break;
      i = next + 1;
      const c = piece.charCodeAt(next);
      if (c === 34 /* " */) {
        inString = true;
        stringStart = base + next;
        // Refused here, not once built: an array of a million strings or `{}` is all stops to the scan.
        if (top.array && ++top.opened > most) throw new ShapeError('members');
      } else if (c === 91 /* [ */ || c === 123 /* { */) {
        if (limits.maxDepth !== undefined && stack.length >= limits.maxDepth) throw new ShapeError('depth');
        if (stack.length >= MOST_FRAMES) return null;
        if (top && ++top.opened > most) throw new ShapeError('members');
        stack.push({ array: c === 91, open: base + next, close: -1, cuts: [], children: [], lastCut: base + next, opened: 0 });
      } else {
        const done = stack.pop();
        if (!done || done.array !== (c === 93)) throw syntaxError(`Unexpected token '${String.fromCharCode(c)}'`);
        done.close = base + next;
        const { lastCut: _, opened: __, ...container } = done;
        if (!stack.length) {
          root = container;
          break scanning;
        }
        if (done.close - done.open >= GROUP_CHARS) stack[stack.length - 1].children.push(container);
      }
    }
    base += piece.length;
  }
  if (!root) throw syntaxError('Unexpected end of input');
  if (nonSpaceAt(text, root.close + 1) >= 0) throw syntaxError('Unexpected non-whitespace character after the root');
  for (const end of protoEnds) {
    const at = nonSpaceAt(text, end);
    if (at >= 0 && text.slice(at, at + 1) === ':') throw new ShapeError('proto');
  }
  return root;
}

/**
 * A container's value: each group of members parsed on its own, the containers of GROUP_CHARS or
 * more among them standing in as `mark` strings until built themselves.
 */
async function build(container: Container, text: PiecedText, clock: Clock, mark: string, limits: ShapeLimits): Promise<unknown> {
  const { array } = container;
  const bounds = [container.open, ...container.cuts, container.close];
  const value: unknown[] | Record<string, unknown> = array ? [] : {};
  let child = 0;
  let members = 0;
  for (let g = 0; g < bounds.length - 1; g++) {
    if (clock.due()) await clock.turn();
    const end = bounds[g + 1];
    const parts = [array ? '[' : '{'];
    const inside: Container[] = [];
    let at = bounds[g] + 1;
    for (; child < container.children.length && container.children[child].open < end; child++) {
      const c = container.children[child];
      parts.push(text.slice(at, c.open), `"${mark}${inside.length}"`);
      inside.push(c);
      at = c.close + 1;
    }
    parts.push(text.slice(at, end), array ? ']' : '}');
    const group = JSON.parse(parts.join('')) as unknown[] | Record<string, unknown>;
    const keys = Array.isArray(group) ? null : Object.keys(group);
    const count = keys ? keys.length : (group as unknown[]).length;
    // Next to a comma, no member is a comma with nothing on one side, which JSON.parse refuses in the whole.
    if (bounds.length > 2 && !count) throw syntaxError("Unexpected token ','");
    members += count;
    if (limits.maxMembers !== undefined && members > limits.maxMembers) throw new ShapeError('members');
    const built: unknown[] = [];
    for (const c of inside) built.push(c.string ? await buildString(c, text, clock) : await build(c, text, clock, mark, limits));
    const real = (v: unknown) => (inside.length && typeof v === 'string' && v.startsWith(mark) ? built[Number(v.slice(mark.length))] : v);
    if (!keys) for (const v of group as unknown[]) (value as unknown[]).push(real(v));
    else {
      // Defined, not assigned: a key `__proto__` is an own member in JSON.parse's value too. A key
      // repeated in a later group keeps its first place and takes the later value, as in JSON.parse.
      for (const k of keys)
        Object.defineProperty(value, real(k) as string, {
          value: real((group as Record<string, unknown>)[k]),
          writable: true,
          enumerable: true,
          configurable: true,
        });
    }
  }
  return value;
}

/**
 * A long string's value, in a turn of its own: without escapes, the text itself (JSON.parse of a
 * 9.5 MB string took ~35 ms here, and joining it into its group as long again).
 */
async function buildString(s: Container, text: PiecedText, clock: Clock): Promise<string> {
  await clock.turn();
  const raw = text.slice(s.open + 1, s.close);
  if (raw.includes('\\')) return JSON.parse(text.slice(s.open, s.close + 1)) as string;
  if (/[\x00-\x1f]/.test(raw)) throw syntaxError('Bad control character in string literal');
  return raw;
}

/**
 * `JSON.parse` of a text given in pieces (as it arrived), in turns of about TURN_MS each: its
 * objects and arrays of GROUP_CHARS or more are parsed a group of members at a time (a 10 MB array
 * of numbers, or of empty objects, took 0.5-1.2 s in one). The same value as JSON.parse, and a
 * SyntaxError for a text it refuses: every character is parsed by JSON.parse once. With `limits`,
 * a text nesting too deep or holding a `__proto__` key is refused with a ShapeError.
 */
export async function parseInTurns(pieces: string[], limits: ShapeLimits = {}): Promise<unknown> {
  const text = new PiecedText(pieces);
  const clock = new Clock();
  const limited = limits.maxDepth !== undefined || limits.refuseProtoKeys || limits.maxMembers !== undefined;
  const root = text.length >= GROUP_CHARS || limited ? await scan(text, clock, limits) : null;
  if (!root || (!root.cuts.length && !root.children.length)) {
    const whole = pieces.length === 1 ? pieces[0] : pieces.join('');
    if (clock.due()) await clock.turn();
    return JSON.parse(whole);
  }
  return await build(root, text, clock, `${randomBytes(12).toString('hex')}:`, limits);
}

/**
 * `JSON.stringify` of a plain object or array as pieces of about TURN_SPLIT_BYTES characters,
 * each serialised in a turn of its own: the root's members (an array's elements) and the elements
 * of its member arrays one at a time. Joined, the pieces are JSON.stringify's text.
 */
export async function stringifyInTurns(value: object): Promise<string[]> {
  const pieces = new Pieces();
  const elements = async (array: unknown[]) => {
    await pieces.add('[');
    for (let i = 0; i < array.length; i++) await pieces.add((i ? ',' : '') + (JSON.stringify(array[i]) ?? 'null'));
    await pieces.add(']');
  };
  if (Array.isArray(value)) await elements(value);
  else {
    let first = true;
    for (const [k, v] of Object.entries(value)) {
      if (Array.isArray(v)) {
        await pieces.add(`${first ? '{' : ','}${JSON.stringify(k)}:`);
        await elements(v);
      } else {
        const text = JSON.stringify(v);
        if (text === undefined) continue; // as JSON.stringify leaves out undefined, functions and symbols
        await pieces.add(`${first ? '{' : ','}${JSON.stringify(k)}:${text}`);
      }
      first = false;
    }
    await pieces.add(first ? '{}' : '}');
  }
  return pieces.end();
}

/**
 * Texts as UTF-8 in one buffer, counted and encoded in turns: a text of TURN_SPLIT_BYTES or more is
 * taken in slices of that many characters (counting 9 MB of JSON took 37 ms in one turn here).
 */
export async function utf8InTurns(texts: string[]): Promise<Buffer> {
  const slices: string[] = [];
  for (const text of texts) {
    for (let from = 0; from < text.length;) {
      let to = Math.min(text.length, from + TURN_SPLIT_BYTES);
      // Not between the two halves of a surrogate pair, which would each be written as U+FFFD.
      const last = text.charCodeAt(to - 1);
      if (to < text.length && last >= 0xd800 && last <= 0xdbff) to--;
      slices.push(text.slice(from, to));
      from = to;
    }
  }
  const sizes: number[] = [];
  for (const slice of slices) {
    await nextTurn();
    sizes.push(Buffer.byteLength(slice));
  }
  const out = Buffer.allocUnsafe(sizes.reduce((a, b) => a + b, 0));
  let written = 0;
  for (const slice of slices) {
    await nextTurn();
    written += out.write(slice, written);
  }
  return out;
}

/**
 * A root array (or a root member array) this long is serialised an element at a time, in turns
 * once it is large: what a provider's large answer is (500 embeddings as floats: 30 MB, 200-235 ms
 * for JSON.stringify in one turn, and as long again to encode), or a long conversation sent to
 * one. Shorter ones, a chat answer's `choices` say, are serialised whole.
 */
const ELEMENT_WISE_LENGTH = 64;

/** Whether `body` has an array long enough to be serialised an element at a time (stringifyInTurns). */
export function hasLongArray(body: object): boolean {
  if (Array.isArray(body)) return body.length >= ELEMENT_WISE_LENGTH;
  for (const k in body) {
    const v = (body as Record<string, unknown>)[k];
    if (Array.isArray(v) && v.length >= ELEMENT_WISE_LENGTH) return true;
  }
  return false;
}
