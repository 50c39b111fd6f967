// The store the Temporal SDK keeps its activity and call contexts in (infrastructure/temporal/sync-scope.ts).
import { spawnSync } from 'node:child_process';
import { expect } from 'chai';
import { SyncScope } from '../../infrastructure/temporal/sync-scope';

describe('SyncScope', () => {
  it('holds its value while the function runs synchronously, then the outer one again', async () => {
    const scope = new SyncScope<string>();
    const seen: (string | undefined)[] = [];
    const inner = scope.run(
      'a',
      async (x: number, y: number) => {
        seen.push(scope.getStore());
        scope.run('b', () => seen.push(scope.getStore()));
        seen.push(scope.getStore());
        await null;
        seen.push(scope.getStore());
        return x + y;
      },
      2,
      3,
    );
    seen.push(scope.getStore());
    expect(await inner).to.equal(5);
    expect(seen).to.deep.equal(['a', 'b', 'a', undefined, undefined]);
  });

  it('gives the outer value back when the function throws', () => {
    const scope = new SyncScope<string>();
    scope.run('outer', () => {
      expect(() =>
        scope.run('inner', () => {
          throw new Error('boom');
        }),
      ).to.throw('boom');
      expect(scope.getStore()).to.equal('outer');
    });
  });

  it("leaves Node's promise hooks off, where an AsyncLocalStorage turns them on for good", () => {
    // In a process of its own: with the hooks on, each await's continuation gets an async id of its own.
    const probe = (storage: string) => `
      const { executionAsyncId, AsyncLocalStorage } = require('node:async_hooks');
      const { SyncScope } = require(${JSON.stringify(require.resolve('../../infrastructure/temporal/sync-scope'))});
      const hooksOn = async () => { await null; const a = executionAsyncId(); await null; return a !== executionAsyncId(); };
      (async () => {
        const before = await hooksOn();
        await new ${storage}().run(1, async () => { await null; });
        console.log(JSON.stringify([before, await hooksOn()]));
      })();`;
    const run = (storage: string) => JSON.parse(spawnSync(process.execPath, ['-e', probe(storage)], { encoding: 'utf8' }).stdout);
    expect(run('SyncScope')).to.deep.equal([false, false]);
    expect(run('AsyncLocalStorage')).to.deep.equal([false, true]);
  });
});
