// Credits and the usage ledger. The balance is derived: grants minus the cost of usage records.
// A usage record's `_id` is its generation id, so the debit is one insert (domain/accounts/usage-ledger):
// atomic on any MongoDB (FerretDB included, which has no transactions) and never applied twice.
// Both sides are read in bounded time: grants are keyed by workspace (one `_id` range), and the
// ledger's cost is its writers' running totals (domain/accounts/usage-totals).
import { randomUUID } from 'node:crypto';
import { workspaceRange, type CreditGrantDoc, type Store } from '../../infrastructure/store';
import { roundUsd } from '../catalog/usd';
import { totalUsage } from './usage-totals';

export interface Balance {
  total_credits: number;
  total_usage: number;
  balance: number;
}

export async function grantCredits(store: Store, workspaceId: string, amount: number, note = 'credits added'): Promise<CreditGrantDoc> {
  if (!Number.isFinite(amount) || amount <= 0) throw new RangeError('amount must be a positive number of USD');
  const doc: CreditGrantDoc = { _id: `${workspaceId}:${randomUUID()}`, workspace_id: workspaceId, amount, note, created_at: new Date() };
  await store.creditGrants.insertOne(doc);
  return doc;
}

async function totalCredits(store: Store, workspaceId: string): Promise<number> {
  const grants = await store.creditGrants.find({ _id: workspaceRange(workspaceId) }, { projection: { amount: 1 } }).toArray();
  return grants.reduce((sum, g) => sum + g.amount, 0);
}

export async function getBalance(store: Store, workspaceId: string): Promise<Balance> {
  const [credits, usage] = await Promise.all([totalCredits(store, workspaceId), totalUsage(store, workspaceId)]);
  return { total_credits: roundUsd(credits), total_usage: roundUsd(usage), balance: roundUsd(credits - usage) };
}
