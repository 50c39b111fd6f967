import { expect } from 'chai';
import { BSON } from 'mongodb';
import { journalLine, takeCheckpointMark } from '../../domain/accounts/usage-journal';
import { newGenerationId, usageDetails } from '../../domain/accounts/usage-ledger';
import type { UsageDoc } from '../../infrastructure/store';
import { sampleDetails, usageSample } from './usage-sample';

/** With the attribution an earlier version kept when absent (nulls): the journal carries either. */
const record: UsageDoc = { ...usageSample, user: null, batch_id: null };

describe('usage journal lines', () => {
  it('are exactly the relaxed Extended JSON the journal reads back, its date a date', () => {
    const line = journalLine(record);
    expect(line).to.equal(`${BSON.EJSON.stringify(record, { relaxed: true })}\n`);
    const back = BSON.EJSON.parse(line, { relaxed: true }) as UsageDoc;
    expect(back).to.deep.equal(record);
    expect(back.created_at).to.be.instanceOf(Date);
  });

  it('carry details as JSON text, whatever keys callers named; details of earlier versions (objects) read too', () => {
    const back = BSON.EJSON.parse(journalLine(record), { relaxed: true }) as UsageDoc;
    expect(back.details).to.be.a('string');
    expect(usageDetails(back)).to.deep.equal(sampleDetails);
    expect(usageDetails({ details: { stream: false } })).to.deep.equal({ stream: false });
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
