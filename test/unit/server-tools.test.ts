// The web searches a request lets a provider run, and the field that asks for them
// (domain/completions/server-tools.ts): what the hold counts and what a 400 names.
import { expect } from 'chai';
import { searchesPerCall, searchField, webSearchesAllowed } from '../../domain/completions/server-tools';

describe('web searches a request allows', () => {
  it('count each search tool’s max_uses (5 without), and one for chat web_search_options; null asks for none', () => {
    expect(
      webSearchesAllowed({ tools: [{ type: 'web_search_20250305', max_uses: 3 }, { type: 'function' }, { type: 'web_search' }] }),
    ).to.equal(8);
    expect(webSearchesAllowed({ web_search_options: {} })).to.equal(1);
    expect(webSearchesAllowed({ web_search_options: { search_context_size: 'high' }, tools: [{ type: 'web_search_preview' }] })).to.equal(
      6,
    );
    expect(webSearchesAllowed({ web_search_options: null, tools: [{ type: 'function' }] })).to.equal(0);
  });

  it('name the field a 400 points at: web_search_options first, else the first search tool', () => {
    expect(searchField({ web_search_options: {}, tools: [{ type: 'web_search' }] })).to.equal('web_search_options');
    expect(searchField({ tools: [{ type: 'function' }, { type: 'web_search_preview' }] })).to.equal('tools[1]');
    expect(searchField({ web_search_options: null, tools: [] })).to.equal(null);
  });

  it('bill one search per chat call sending web_search_options, unless a translation dropped it', () => {
    expect(searchesPerCall('chat', { web_search_options: {} }, [])).to.equal(1);
    expect(searchesPerCall('chat', { web_search_options: {} }, ['web_search_options'])).to.equal(0);
    expect(searchesPerCall('chat', { web_search_options: null }, [])).to.equal(0);
    expect(searchesPerCall('responses', { web_search_options: {} }, [])).to.equal(0);
  });
});
