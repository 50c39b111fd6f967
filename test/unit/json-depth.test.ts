import { expect } from 'chai';
import { jsonDepthOver } from '../../api/body';

describe('JSON depth check', () => {
  it('counts objects and arrays, not brackets inside strings, escaped quotes and backslashes included', () => {
    const nested = (n: number) => `${'['.repeat(n)}${']'.repeat(n)}`;
    expect(jsonDepthOver(nested(64), 64)).to.equal(false);
    expect(jsonDepthOver(nested(65), 64)).to.equal(true);
    expect(jsonDepthOver(`{"a":${nested(63)}}`, 64)).to.equal(false);
    expect(jsonDepthOver(`{"a":${nested(64)}}`, 64)).to.equal(true);
    // Brackets in strings: plain, after a quote (escaped in the JSON), ending in a backslash (escaped,
    // so the next quote ends the string), after a backslash and a quote.
    for (const inside of ['[[[[', '"[[[[', '[[\\', '\\"[[[[', '\\']) {
      const text = JSON.stringify({ s: inside, t: [[[]]] });
      expect(jsonDepthOver(text, 4), text).to.equal(false);
      expect(jsonDepthOver(text, 3), text).to.equal(true);
    }
    // A string that never ends is left to the parser.
    expect(jsonDepthOver('{"a":"[[[[[[', 2)).to.equal(false);
  });

  it('matches a character-by-character scan on random JSON with escapes', () => {
    const reference = (text: string, max: number) => {
      let depth = 0;
      for (let i = 0; i < text.length; i++) {
        const c = text[i];
        if (c === '"') {
          for (i++; i < text.length && text[i] !== '"'; i++) if (text[i] === '\\') i++;
        } else if (c === '{' || c === '[') {
          if (++depth > max) return true;
        } else if (c === '}' || c === ']') depth--;
      }
      return false;
    };
    const pieces = ['"', '\\', '[', ']', '{', '}', 'a', ' '];
    const value = (d: number): unknown => {
      const r = Math.random();
      if (d > 6 || r < 0.4)
        return Array.from({ length: Math.floor(Math.random() * 6) }, () => pieces[Math.floor(Math.random() * pieces.length)]).join('');
      if (r < 0.7) return Array.from({ length: Math.floor(Math.random() * 3) }, () => value(d + 1));
      return { k: value(d + 1), [pieces.join('')]: value(d + 1) };
    };
    for (let n = 0; n < 2_000; n++) {
      const text = JSON.stringify(value(0));
      for (const max of [1, 3, 5]) expect(jsonDepthOver(text, max), text).to.equal(reference(text, max));
    }
  });
});
