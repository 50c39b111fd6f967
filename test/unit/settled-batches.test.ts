import { expect } from 'chai';
import { isSettled, SettledBatches } from '../../domain/batches/settled-batches';
import type { BatchDoc } from '../../domain/batches/store';

const batch = (id: string, over: Partial<BatchDoc>) =>
  ({ _id: id, status: 'completed', callback_url: null, webhook: null, ...over }) as BatchDoc;

describe('settled batches', () => {
  it('are closed, and done with their webhook if they have one', () => {
    expect(isSettled(batch('a', {}))).to.equal(true);
    for (const status of ['failed', 'expired', 'cancelled'] as const) expect(isSettled(batch('a', { status }))).to.equal(true);
    for (const status of ['validating', 'in_progress', 'finalizing', 'cancelling'] as const) {
      expect(isSettled(batch('a', { status })), status).to.equal(false);
    }
    // Its webhook outcome is still to be written to the document.
    expect(isSettled(batch('a', { callback_url: 'https://example.com/hook' }))).to.equal(false);
    const outcome = { status: 'delivered', attempts: 1, last_status: 200, last_error: null } as const;
    expect(isSettled(batch('a', { callback_url: 'https://example.com/hook', webhook: outcome }))).to.equal(true);
  });

  it('keeps only settled documents, up to its count, the least recently listed leaving first', () => {
    const kept = new SettledBatches(3);
    kept.keep(batch('running', { status: 'in_progress' }));
    expect(kept.get('running')).to.equal(undefined);
    for (const id of ['a', 'b', 'c']) kept.keep(batch(id, {}));
    kept.get('a');
    kept.keep(batch('d', {}));
    expect(kept.held).to.equal(3);
    expect(kept.get('b')).to.equal(undefined);
    expect(['a', 'c', 'd'].map((id) => kept.get(id)?._id)).to.deep.equal(['a', 'c', 'd']);
  });
});
