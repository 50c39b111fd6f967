// Credits and the usage ledger. The balance is derived: grants minus the cost of usage records.
// A usage record's `_id` is its generation id, so the debit is one insert (accounts/usage-ledger):
// atomic on any MongoDB (FerretDB included, which has no transactions) and never applied twice.
import { randomUUID } from 'node:crypto';
import type { CreditGrantDoc, Store } from '../store';
import { roundUsd } from '../catalog/usd';

export interface Balance {
  total_credits: number;
  total_usage: number;
  balance: number;
}

export async function grantCredits(store: Store, workspaceId: string, amount: number, note = 'credits added'): Promise<CreditGrantDoc> {
  if (!Number.isFinite(amount) || amount <= 0) throw new RangeError('amount must be a positive number of USD');
  const doc: CreditGrantDoc = { _id: randomUUID(), workspace_id: workspaceId, amount, note, created_at: new Date() };
  await store.creditGrants.insertOne(doc);
  return doc;
}

async function sum(coll: Store['creditGrants'] | Store['usage'], workspaceId: string, field: 'amount' | 'cost'): Promise<number> {
  const [row] = await (coll as Store['usage'])
    .aggregate<{ total: number }>([{ $match: { workspace_id: workspaceId } }, { $group: { _id: null, total: { $sum: `$${field}` } } }])
    .toArray();
  return row?.total ?? 0;
}

export async function getBalance(store: Store, workspaceId: string): Promise<Balance> {
  const [credits, usage] = await Promise.all([sum(store.creditGrants, workspaceId, 'amount'), sum(store.usage, workspaceId, 'cost')]);
  return { total_credits: roundUsd(credits), total_usage: roundUsd(usage), balance: roundUsd(credits - usage) };
}
