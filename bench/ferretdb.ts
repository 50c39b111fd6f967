// What FerretDB's garbage collector setting (FERRETDB_GOGC, devstack/services.ts) saves: two
// FerretDBs side by side, one at Go's default (GOGC=100) and one as the stack starts it, each taking
// what the usage ledger writes for every billed call (packed usage records in groups, each group
// announced in the writer's running total first), in rounds taking turns. Reported: each one's
// CPU a record and its peak memory.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { MongoClient } from 'mongodb';
import { ensureTools } from '../devstack/binaries';
import { defaultToolsDir } from '../infrastructure/config';
import { freePort } from '../devstack/processes';
import { FERRETDB_GOGC, startFerretDB, type RunningService } from '../devstack/services';
import { toStoredUsage } from '../infrastructure/store/usage-form';
import type { UsageDoc } from '../infrastructure/store';
import { cpuSeconds, round2, writeResult } from './harness';
import { peakRssMb } from './batches';

/** Records an insert carries: about what the ledger's 50 ms groups hold at c=50. */
const GROUP = 100;
const GROUPS_PER_ROUND = 200;
const ROUNDS = 4;
const BARS = { max_cpu_ratio_to_go_default: 0.85, max_peak_rss_mb: 128 };
const WORKSPACE = '0f8fad5b-d9cb-469f-a165-70867728950e';

export async function benchFerretDB() {
  const tools = await ensureTools(process.env.TOOLS_DIR ?? defaultToolsDir(), { temporal: false, ferretdb: true });
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'gateway-bench-ferretdb-'));
  const { GOGC: _, ...unset } = process.env;
  const setups = { go_default: '100', stack: undefined };
  const servers: Record<string, RunningService> = {};
  for (const [name, gogc] of Object.entries(setups)) {
    const env = gogc === undefined ? unset : { ...unset, GOGC: gogc };
    servers[name] = await startFerretDB({ binary: tools.ferretdb, port: await freePort(), dataDir: path.join(dir, name), env });
  }
  const clients: Record<string, MongoClient> = {};
  try {
    for (const [name, s] of Object.entries(servers)) clients[name] = await new MongoClient(s.address).connect();
    let next = 0;
    const record = (group: number): UsageDoc => ({
      _id: `gen-${Date.now().toString(36)}${(next++).toString(16).padStart(20, '0')}`,
      workspace_id: WORKSPACE,
      key_id: 'key-bench',
      kind: 'completion',
      model: 'bench/chat',
      provider: 'bench',
      input_tokens: 12,
      output_tokens: 9,
      cost: 0.0000048,
      writer: 'wbench',
      group,
      created_at: new Date(),
    });
    const round = async (client: MongoClient) => {
      const db = client.db('bench');
      for (let g = 0; g < GROUPS_PER_ROUND; g++) {
        const docs = Array.from({ length: GROUP }, () => record(g));
        await db
          .collection('usage_totals')
          .updateOne(
            { _id: `${WORKSPACE}:wbench` as never },
            { $set: { cost: g, pending: { group: g, ids: JSON.stringify(docs.map((d) => d._id)) }, updated_at: new Date() } },
            { upsert: true },
          );
        await db.collection('usage').insertMany(docs.map(toStoredUsage) as never[], { ordered: false });
      }
    };
    for (const c of Object.values(clients)) await round(c); // warm-up
    const cpu: Record<string, number> = {};
    const names = Object.keys(servers);
    for (let r = 0; r < ROUNDS; r++) {
      for (let i = 0; i < names.length; i++) {
        const name = names[(r + i) % names.length];
        const before = cpuSeconds(servers[name].process.pid);
        await round(clients[name]);
        cpu[name] = (cpu[name] ?? 0) + cpuSeconds(servers[name].process.pid) - before;
      }
    }
    const records = ROUNDS * GROUPS_PER_ROUND * GROUP;
    const rows = Object.fromEntries(
      names.map((name) => [
        name,
        {
          gogc: setups[name as keyof typeof setups] ?? FERRETDB_GOGC,
          cpu_us_per_record: round2((cpu[name] * 1e6) / records),
          peak_rss_mb: peakRssMb(servers[name].process.pid),
        },
      ]),
    );
    const verdicts = {
      cpu_ratio_to_go_default: rows.stack.cpu_us_per_record <= rows.go_default.cpu_us_per_record * BARS.max_cpu_ratio_to_go_default,
      peak_rss: rows.stack.peak_rss_mb <= BARS.max_peak_rss_mb,
    };
    const result = {
      benchmark: 'ferretdb',
      at: new Date().toISOString(),
      machine: { cpus: os.cpus().length, node: process.version },
      bars: BARS,
      verdicts,
      records_per_setup: records,
      group: GROUP,
      rows,
    };
    const file = writeResult('ferretdb', result);
    for (const [name, row] of Object.entries(rows))
      console.log(`${name.padEnd(10)} GOGC ${row.gogc.padEnd(4)} ${row.cpu_us_per_record} µs of CPU a record, peak ${row.peak_rss_mb} MB`);
    console.log(`verdicts: ${JSON.stringify(verdicts)}`);
    console.log(`results: ${file}`);
    return result;
  } finally {
    await Promise.all(Object.values(clients).map((c) => c.close()));
    await Promise.all(Object.values(servers).map((s) => s.process.stop()));
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
