import type { UsageDoc } from '../../infrastructure/store';

/** The details of the sample below; a question named `$date` is what an object would not survive (Extended JSON). */
export const sampleDetails = { ending: 'completed', label_mass: 0.99, providers: { $date: 'sandbox', q2: 'other' } };

/** A usage record as the ledger builds it: absent attribution left out, trace and details as JSON text. */
export const usageSample: UsageDoc = {
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
  details: JSON.stringify(sampleDetails),
  created_at: new Date('2026-11-25T17:00:00.123Z'),
  writer: 'w1',
  group: 3,
};
