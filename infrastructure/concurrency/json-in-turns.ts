// JSON of many megabytes parsed and serialised in turns of the event loop. V8 parses and
// serialises a text whole: 30 MB of embeddings as floats took 140-240 ms each way in one turn,
// and encoding the text as many again, holding every other request of the process meanwhile.
// The large answers providers send are a root object whose bulk is an array of many elements
// (`data`, `choices`, `content`), so the work is split at that array's elements; a text or value
// of any other shape goes whole, as before.
import { nextTurn, TURN_SPLIT_BYTES } from './next-turn';

/** A root member array smaller than this goes with the rest of the root object. */
const SPLIT_ARRAY_CHARS = TURN_SPLIT_BYTES;

/** Where a root member's array is in the text: its key, and the positions inside its brackets. */
interface SplitArray {
  key: string;
  /** First character after `[`. */
  start: number;
  /** The `]`. */
  end: number;
  /**
   * The commas its element groups end at: the first between two elements TURN_SPLIT_BYTES or more
   * past the last (every comma of a 256 MB array of digits would take a gigabyte to keep).
   */
  commas: number[];
}

/** Texts joined into pieces of about TURN_SPLIT_BYTES characters, with a turn after each piece. */
export class Pieces {
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

/**
 * The root object's member arrays of SPLIT_ARRAY_CHARS or more, found by a scan of the text that
 * takes turns every TURN_SPLIT_BYTES characters. Null when the root is not an object, a root key
 * repeats (JSON.parse keeps the last value, which the split would have to reproduce), or the text
 * is malformed as far as brackets and strings go: the caller then parses the whole.
 */
async function splitArrays(text: PiecedText): Promise<SplitArray[] | null> {
  // Past depth 2 (inside an array's elements) only strings and brackets matter, and past a
  // string's opening quote only its closing one: regular expressions skip to them natively (a
  // character-by-character loop over 30 MB took ~140 ms; the floats inside need not be looked at).
  const inStringStop = /["\\]/g;
  const deepStop = /["[\]{}]/g;
  const found: SplitArray[] = [];
  const keys = new Set<string>();
  let depth = 0;
  let inString = false;
  let escaped = false;
  let stringStart = -1;
  /** The last string closed at depth 1 (a key, when a colon follows). */
  let lastString: [number, number] | null = null;
  let key: string | null = null;
  let current: SplitArray | null = null;
  /** Where the current array's group of elements began (its `[` or a comma). */
  let groupFrom = 0;
  let base = 0;
  let sinceTurn = 0;
  for (const piece of text.pieces) {
    for (let i = 0; i < piece.length; i++) {
      if (escaped) {
        escaped = false;
        continue;
      }
      if (inString || depth >= 3) {
        const stop = inString ? inStringStop : deepStop;
        stop.lastIndex = i;
        const m = stop.exec(piece);
        if (!m) break;
        i = m.index;
      }
      const c = piece.charCodeAt(i);
      if (inString) {
        if (c === 92 /* \ */) escaped = true;
        else {
          inString = false;
          if (depth === 1) lastString = [stringStart, base + i + 1];
        }
        continue;
      }
      switch (c) {
        case 34 /* " */:
          inString = true;
          stringStart = base + i;
          break;
        case 58 /* : */:
          if (depth === 1 && lastString) {
            key = JSON.parse(text.slice(lastString[0], lastString[1])) as string;
            if (keys.has(key)) return null;
            keys.add(key);
          }
          break;
        case 123 /* { */:
        case 91 /* [ */:
          if (depth === 0 && c !== 123) return null;
          depth++;
          if (depth === 2 && c === 91 && key !== null)
            ((current = { key, start: base + i + 1, end: -1, commas: [] }), (groupFrom = base + i));
          break;
        case 125 /* } */:
        case 93 /* ] */:
          if (depth === 2 && current) {
            current.end = base + i;
            if (current.end - current.start >= SPLIT_ARRAY_CHARS) found.push(current);
            current = null;
          }
          depth--;
          if (depth < 0) return null;
          break;
        case 44 /* , */:
          if (depth === 2 && current) {
            if (base + i - groupFrom >= TURN_SPLIT_BYTES) current.commas.push((groupFrom = base + i));
          } else if (depth === 1) ((key = null), (lastString = null));
          break;
      }
    }
    base += piece.length;
    sinceTurn += piece.length;
    if (sinceTurn >= TURN_SPLIT_BYTES) {
      sinceTurn = 0;
      await nextTurn();
    }
  }
  return depth === 0 && !inString ? found : null;
}

/**
 * `JSON.parse` of a text given in pieces (as it arrived), in turns of about TURN_SPLIT_BYTES
 * characters each: the root object's large member arrays are parsed a group of elements at a
 * time, the rest of the object in one piece. The same value as JSON.parse, and the same failure
 * (a SyntaxError) for a text it refuses: every character is parsed by JSON.parse once.
 */
export async function parseInTurns(pieces: string[]): Promise<unknown> {
  const text = new PiecedText(pieces);
  const arrays = text.length >= SPLIT_ARRAY_CHARS ? await splitArrays(text) : null;
  if (!arrays?.length) {
    const whole = pieces.join('');
    if (whole.length >= TURN_SPLIT_BYTES) await nextTurn(); // joined in one turn, parsed in the next
    return JSON.parse(whole);
  }
  // The root object with each large array left empty, then each array's elements.
  const skeleton: string[] = [];
  let from = 0;
  for (const a of arrays) {
    skeleton.push(text.slice(from, a.start));
    from = a.end;
  }
  skeleton.push(text.slice(from, text.length));
  const root = JSON.parse(skeleton.join('')) as Record<string, unknown>;
  for (const a of arrays) {
    const elements: unknown[] = [];
    const bounds = [a.start - 1, ...a.commas, a.end]; // the `[`, the groups' commas, the `]`
    for (let g = 0; g < bounds.length - 1; g++) {
      await nextTurn();
      const group = JSON.parse(`[${text.slice(bounds[g] + 1, bounds[g + 1])}]`) as unknown[];
      // After a comma, nothing is a trailing comma, which JSON.parse refuses in the whole.
      if (g > 0 && !group.length) throw new SyntaxError("Unexpected token ']' after a comma in JSON");
      for (const e of group) elements.push(e);
    }
    // Defined, not assigned: a key `__proto__` is an own member in JSON.parse's value too.
    Object.defineProperty(root, a.key, { value: elements, writable: true, enumerable: true, configurable: true });
  }
  return root;
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
