import { expect } from 'chai';
import { BSON } from 'mongodb';
import { journalLine, takeCheckpointMark } from '../../domain/accounts/usage-journal';
import { newGenerationId, usageDetails } from '../../domain/accounts/usage-ledger';
import type { UsageDoc } from '../../infrastructure/store';

const record: UsageDoc = {
  _id: 'gen-abc',
  workspace_id: 'ws',
  key_id: 'key',
  kind: 'completion',
  model: 'sandbox/chat-1',
  provider: 'sandbox',
  input_tokens: 12,
  output_tokens: 7,
  cost: 0.000123456789,
  session_id: 'conversation "1"',
  user: null,
  trace: JSON.stringify({ trace_id: 't', nested: { a: [1, 2] } }),
  app: { referer: 'https://x.example', title: 'é ✓', categories: ['a'] },
  batch_id: null,
  details: { stream: false, label_mass: 0.99, providers: { q: 'p' } },
  created_at: new Date('2026-11-25T17:00:00.123Z'),
  writer: 'w1',
  group: 3,
};

describe('usage journal lines', () => {
  it('are exactly the relaxed Extended JSON the journal reads back, its date a date', () => {
    const line = journalLine(record);
    expect(line).to.equal(`${BSON.EJSON.stringify(record, { relaxed: true })}\n`);
    const back = BSON.EJSON.parse(line, { relaxed: true }) as UsageDoc;
    expect(back).to.deep.equal(record);
    expect(back.created_at).to.be.instanceOf(Date);
  });

  it('carry details in either stored form: JSON text (current) or an object (earlier versions)', () => {
    const text = { ...record, details: JSON.stringify(record.details) };
    const back = BSON.EJSON.parse(journalLine(text), { relaxed: true }) as UsageDoc;
    expect(back.details).to.be.a('string');
    expect(usageDetails(back)).to.deep.equal(record.details);
    expect(usageDetails(record)).to.deep.equal(record.details);
    expect(usageDetails({ details: undefined })).to.equal(null);
  });

  it("carry a checkpoint's mark, which the reader takes off", () => {
    const back = BSON.EJSON.parse(journalLine(record, true), { relaxed: true }) as UsageDoc;
    expect(takeCheckpointMark(back)).to.equal(true);
    expect(back).to.deep.equal(record);
  });
});

describe('generation ids', () => {
  it('are time-ordered, then 80 random bits, and do not repeat across blocks of random bytes', () => {
    const ids = Array.from({ length: 2_000 }, () => newGenerationId());
    expect(new Set(ids).size).to.equal(ids.length);
    for (const id of ids) expect(id).to.match(/^gen-[0-9a-z]{8,9}[0-9a-f]{20}$/);
    expect(newGenerationId('gen-dec-')).to.match(/^gen-dec-/);
  });
});
