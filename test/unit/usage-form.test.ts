import { expect } from 'chai';
import { fromStoredUsage, toStoredUsage } from '../../infrastructure/store/usage-form';
import { usageSample as record } from './usage-sample';

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
