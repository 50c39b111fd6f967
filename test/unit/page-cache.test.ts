import { expect } from 'chai';
import { PageCache } from '../../domain/batches/page-cache';

const page = (id: string, chars: number) => ({ _id: id, first: 0, lines: ['x'.repeat(chars)] });

describe('PageCache: result pages kept for repeated reads', () => {
  it('keeps pages up to its budget, dropping the least recently read first', () => {
    const cache = new PageCache(800);
    for (const id of ['a', 'b', 'c', 'd']) cache.add(page(id, 100));
    expect(cache.get('a')?._id).to.equal('a'); // now the most recently read
    for (const id of ['e', 'f', 'g', 'h', 'i']) cache.add(page(id, 100));
    expect(cache.heldChars).to.equal(800);
    // Nine pages of 100 in a budget of 800: the one read least recently (b) went, not a.
    expect(cache.get('b')).to.equal(undefined);
    expect(['a', 'c', 'd', 'e', 'f', 'g', 'h', 'i'].map((id) => cache.get(id)?._id)).to.deep.equal([
      'a',
      'c',
      'd',
      'e',
      'f',
      'g',
      'h',
      'i',
    ]);
  });

  it('keeps a page once, and not a page of more than an eighth of its budget', () => {
    const cache = new PageCache(800);
    cache.add(page('a', 100));
    cache.add(page('a', 100));
    expect(cache.heldChars).to.equal(100);
    cache.add(page('big', 101));
    expect(cache.get('big')).to.equal(undefined);
    expect(cache.heldChars).to.equal(100);
  });
});
