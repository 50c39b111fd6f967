// OpenRouter's plugins (domain/completions/plugins.ts): the web plugin as the provider's own search
// in each format, and the others named as not run.
import { expect } from 'chai';
import { BadRequestError } from '../../infrastructure/errors';
import { pluginsNotRun, withWebPlugin } from '../../domain/completions/plugins';

describe('the web plugin', () => {
  const messages = [{ role: 'user', content: 'news?' }];

  it('becomes each format’s search setting, keeping a search the request already has', () => {
    expect(withWebPlugin({ messages, plugins: [{ id: 'web' }] }, 'chat', null).web_search_options).to.deep.equal({});
    const own = { search_context_size: 'high' };
    expect(withWebPlugin({ messages, plugins: [{ id: 'web' }], web_search_options: own }, 'chat', null).web_search_options).to.equal(own);
    expect(
      withWebPlugin({ messages, plugins: [{ id: 'web', max_uses: 2, exclude_domains: ['x.com'] }] }, 'messages', null).tools,
    ).to.deep.equal([{ type: 'web_search_20250305', name: 'web_search', max_uses: 2, blocked_domains: ['x.com'] }]);
    const tool = { type: 'web_search_20250305', name: 'web_search', max_uses: 1 };
    expect(withWebPlugin({ messages, tools: [tool] }, 'messages', 'online').tools).to.deep.equal([tool]);
    expect(withWebPlugin({ input: 'x', tools: [{ type: 'function', name: 'f' }] }, 'responses', 'online').tools).to.deep.equal([
      { type: 'function', name: 'f' },
      { type: 'web_search' },
    ]);
  });

  it('does nothing without the plugin or when it is turned off; refuses other engines and operations', () => {
    const body = { messages, plugins: [{ id: 'response-healing' }, { id: 'web', enabled: false }] };
    expect(withWebPlugin(body, 'chat', null)).to.equal(body);
    expect(() => withWebPlugin({ messages, plugins: [{ id: 'moderation' }, { id: 'web', engine: 'firecrawl' }] }, 'chat', null)).to.throw(
      BadRequestError,
      /^plugins\[1\]\.engine: "firecrawl" is a search service/,
    );
    expect(() => withWebPlugin({ input: 'x' }, 'embeddings', 'online')).to.throw(BadRequestError, /^model: web search is for/);
  });

  it('names the plugins turned on that are not run', () => {
    const plugins = [{ id: 'web' }, { id: 'response-healing' }, { id: 'moderation', enabled: false }, { id: 'file-parser', enabled: true }];
    expect(pluginsNotRun({ plugins })).to.deep.equal(['plugins.response-healing', 'plugins.file-parser']);
    expect(pluginsNotRun({ plugins: 'web' })).to.deep.equal([]);
    expect(pluginsNotRun({ transforms: ['middle-out', 7] })).to.deep.equal(['transforms.middle-out']);
  });
});
