import { expect } from 'chai';
import { inPieces, PIECE_CHARS } from '../../api/pieces';

/** Texts that come without any wait, as pages read from memory do. */
async function* ready(count: number, text: string): AsyncGenerator<string> {
  for (let i = 0; i < count; i++) yield text;
}

describe('inPieces: streamed texts joined for writing', () => {
  it('joins texts into pieces of about 64 KB, every text whole and in order', async () => {
    const texts = Array.from({ length: 1000 }, (_, i) => `{"line":${i},"pad":"${'x'.repeat(200)}"}\n`);
    const pieces: string[] = [];
    for await (const p of inPieces(
      (async function* () {
        yield* texts;
      })(),
    ))
      pieces.push(p);
    expect(pieces.join('')).to.equal(texts.join(''));
    expect(pieces.length).to.be.within(3, 5);
    for (const p of pieces.slice(0, -1)) expect(p.length).to.be.within(PIECE_CHARS, PIECE_CHARS + 300);
  });

  it('lets the event loop turn between pieces, even when every text is ready at once', async () => {
    let turns = 0;
    let counting = true;
    const tick = () => {
      turns++;
      if (counting) setImmediate(tick);
    };
    setImmediate(tick);
    let pieces = 0;
    for await (const _ of inPieces(ready(200, 'x'.repeat(4 * 1024)))) pieces++;
    counting = false;
    // 800 KB in pieces of 64 KB: 13 pieces, a turn after each of the first 12.
    expect(pieces).to.equal(13);
    expect(turns).to.be.at.least(12);
  });
});
