// Admin commands that work on the database directly: workspaces, keys and credits.
import type { Command } from 'commander';
import { Store } from '../infrastructure/store';
import { createWorkspace, findWorkspace, listWorkspaces } from '../domain/accounts/workspaces';
import { createKey, listKeys, revokeKey } from '../domain/accounts/keys';
import { getBalance, grantCredits } from '../domain/accounts/credits';
import { configuredAddresses, type Config } from '../infrastructure/config';

type Out = (value: unknown, human: string) => void;

async function withStore<T>(config: Config, fn: (store: Store) => Promise<T>): Promise<T> {
  const store = await Store.connect(configuredAddresses(config).mongoUri, config.mongo.database);
  try {
    return await fn(store);
  } finally {
    await store.close();
  }
}

function output(json: boolean): Out {
  return (value, human) => process.stdout.write(`${json ? JSON.stringify(value) : human}\n`);
}

/** A USD amount: positive for a top-up; zero allowed where nothing is granted (a new workspace). */
function usd(raw: string, allowZero = false): number {
  const n = raw.trim() === '' ? NaN : Number(raw);
  if (!Number.isFinite(n) || n < 0 || (n === 0 && !allowZero)) {
    throw new Error(`amount must be a ${allowZero ? 'non-negative' : 'positive'} number of USD, got ${JSON.stringify(raw)}`);
  }
  return n;
}

export function addAdminCommands(program: Command, config: () => Config): void {
  const workspaces = program.command('workspaces').description('manage workspaces');
  workspaces
    .command('create')
    .requiredOption('--name <name>', 'workspace name (unique)')
    .option('--credits <usd>', 'initial credits in USD')
    .option('--json', 'print JSON')
    .action(async (o: { name: string; credits?: string; json?: boolean }) =>
      withStore(config(), async (store) => {
        // A workspace without credits is normal: it answers 402 until some are added.
        const credits = o.credits === undefined ? 0 : usd(o.credits, true);
        const ws = await createWorkspace(store, o.name);
        if (credits > 0) await grantCredits(store, ws._id, credits, 'initial credits');
        output(!!o.json)({ id: ws._id, name: ws.name, credits }, `created workspace ${ws.name} (${ws._id}) with $${credits}`);
      }),
    );
  workspaces
    .command('list')
    .option('--json', 'print JSON')
    .action(async (o: { json?: boolean }) =>
      withStore(config(), async (store) => {
        const all = await listWorkspaces(store);
        output(!!o.json)(
          all.map((w) => ({ id: w._id, name: w.name })),
          all.map((w) => `${w._id}  ${w.name}`).join('\n'),
        );
      }),
    );

  const keys = program.command('keys').description('manage API keys');
  keys
    .command('create')
    .requiredOption('--workspace <name|id>', 'workspace')
    .option('--management', 'a management key (default: inference)')
    .option('--name <name>', 'a name for people')
    .option('--json', 'print JSON')
    .action(async (o: { workspace: string; management?: boolean; name?: string; json?: boolean }) =>
      withStore(config(), async (store) => {
        const ws = await findWorkspace(store, o.workspace);
        const k = await createKey(store, ws._id, { kind: o.management ? 'management' : 'inference', name: o.name });
        output(!!o.json)(
          { key: k.key, id: k.id, workspace_id: k.workspace_id, kind: k.kind },
          `${k.kind} key ${k.id} for ${ws.name} — shown once, store it now:\n${k.key}`,
        );
      }),
    );
  keys
    .command('list')
    .option('--workspace <name|id>', 'only this workspace')
    .option('--json', 'print JSON')
    .action(async (o: { workspace?: string; json?: boolean }) =>
      withStore(config(), async (store) => {
        const wsId = o.workspace ? (await findWorkspace(store, o.workspace))._id : undefined;
        const all = await listKeys(store, wsId);
        output(!!o.json)(
          all,
          all.map((k) => `${k.id}  ${k.kind.padEnd(10)} ${k.label}  ${k.revoked_at ? 'revoked' : 'active'}  ${k.name}`).join('\n'),
        );
      }),
    );
  keys
    .command('revoke <id>')
    .option('--json', 'print JSON')
    .action(async (id: string, o: { json?: boolean }) =>
      withStore(config(), async (store) => {
        const k = await revokeKey(store, id);
        output(!!o.json)(k, `revoked ${k.id}`);
      }),
    );

  const credits = program.command('credits').description('manage workspace credits');
  credits
    .command('add')
    .requiredOption('--workspace <name|id>', 'workspace')
    .requiredOption('--amount <usd>', 'USD to add')
    .option('--json', 'print JSON')
    .action(async (o: { workspace: string; amount: string; json?: boolean }) =>
      withStore(config(), async (store) => {
        const amount = usd(o.amount);
        const ws = await findWorkspace(store, o.workspace);
        await grantCredits(store, ws._id, amount);
        const b = await getBalance(store, ws._id);
        output(!!o.json)({ workspace_id: ws._id, added: amount, ...b }, `added $${amount} to ${ws.name}; balance $${b.balance}`);
      }),
    );
  credits
    .command('show')
    .requiredOption('--workspace <name|id>', 'workspace')
    .option('--json', 'print JSON')
    .action(async (o: { workspace: string; json?: boolean }) =>
      withStore(config(), async (store) => {
        const ws = await findWorkspace(store, o.workspace);
        const b = await getBalance(store, ws._id);
        output(!!o.json)(
          { workspace_id: ws._id, ...b },
          `${ws.name}: credits $${b.total_credits}, usage $${b.total_usage}, balance $${b.balance}`,
        );
      }),
    );
}
