import { expect } from 'chai';
import { fromStoredUsage, toStoredUsage } from '../../infrastructure/store/usage-form';
import type { UsageDoc } from '../../infrastructure/store';

/** A record as the ledger stores it: absent attribution left out, details and trace as JSON text. */
const record: UsageDoc = {
  _id: 'gen-abc',
  workspace_id: 'ws',
  key_id: 'key',
  kind: 'completion',
  model: 'sandbox/chat-1',
  provider: null,
  input_tokens: 12,
  output_tokens: 7,
  cost: 0.000123456789,
  session_id: 'conversation "1"',
  trace: JSON.stringify({ trace_id: 't', nested: { a: [1, 2] } }),
  app: { referer: 'https://x.example', title: 'é ✓\u2028', categories: ['a'] },
  details: JSON.stringify({ ending: 'completed', label_mass: 0.99 }),
  created_at: new Date('2026-11-25T17:00:00.123Z'),
  writer: 'w1',
  group: 3,
};

describe('usage records as stored', () => {
  it('are three fields: _id, workspace_id and the rest as JSON text (batch_id as a fourth when there is one)', () => {
    const stored = toStoredUsage(record);
    expect(Object.keys(stored)).to.deep.equal(['_id', 'workspace_id', 'record']);
    expect(stored).to.include({ _id: 'gen-abc', workspace_id: 'ws' });
    expect(JSON.parse(stored.record!)).to.not.have.any.keys('_id', 'workspace_id', 'batch_id');
    const line = toStoredUsage({ ...record, kind: 'batch_line', batch_id: 'batch_1' });
    expect(Object.keys(line)).to.deep.equal(['_id', 'workspace_id', 'batch_id', 'record']);
  });

  it('read back as the record they were, its date a date, whichever fields it had', () => {
    expect(fromStoredUsage(toStoredUsage(record))).to.deep.equal(record);
    const line = { ...record, kind: 'batch_line' as const, batch_id: 'batch_1' };
    expect(fromStoredUsage(toStoredUsage(line))).to.deep.equal(line);
    expect(fromStoredUsage(toStoredUsage(record)).created_at).to.be.instanceOf(Date);
  });

  it('of earlier versions (every field at the top) read as they are', () => {
    const earlier = { ...record, batch_id: null, user: null };
    expect(fromStoredUsage(earlier)).to.equal(earlier);
  });
});
