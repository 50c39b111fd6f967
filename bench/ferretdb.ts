// What FerretDB's garbage collector setting (FERRETDB_GOGC, devstack/services.ts) saves: two
// FerretDBs side by side, one at Go's default (GOGC=100) and one as the stack starts it, each taking
// a usage ledger's writes for billed calls (domain/accounts/usage-ledger: packed records in groups,
// each group announced in the writer's running total first), in rounds taking turns. Reported:
// each one's CPU a record, the inserts the ledger made, and its peak memory.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { randomUUID } from 'node:crypto';
import { ensureTools } from '../devstack/binaries';
import { defaultToolsDir } from '../infrastructure/config';
import { freePort } from '../devstack/processes';
import { FERRETDB_GOGC, startFerretDB, type RunningService } from '../devstack/services';
import { Store } from '../infrastructure/store';
import { UsageLedger, newGenerationId, usageRecordOf } from '../domain/accounts/usage-ledger';
import { cpuSeconds, round2, writeResult } from './harness';
import { peakRssMb } from './batches';

/** Records an insert carries: about what the ledger's 50 ms groups hold at c=50. */
const GROUP = 100;
const GROUPS_PER_ROUND = 200;
const ROUNDS = 4;
const BARS = { max_cpu_ratio_to_go_default: 0.85, max_peak_rss_mb: 128 };
const NO_ATTRIBUTION = { session_id: null, user: null, trace: null, app: { referer: null, title: null, categories: [] } };

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
  const stores: Record<string, Store> = {};
  const ledgers: Record<string, UsageLedger> = {};
  try {
    for (const [name, s] of Object.entries(servers)) {
      stores[name] = await Store.connect(s.address, 'bench');
      ledgers[name] = new UsageLedger(stores[name]);
    }
    const workspaceId = randomUUID();
    // The ledger's own writes: records awaited together go as one group (one insert, its total announced first).
    const round = async (ledger: UsageLedger) => {
      for (let g = 0; g < GROUPS_PER_ROUND; g++) {
        await Promise.all(
          Array.from({ length: GROUP }, () =>
            ledger.recordStored(
              usageRecordOf(
                { generationId: newGenerationId(), workspaceId, keyId: 'key-bench', kind: 'completion', meta: NO_ATTRIBUTION },
                { model: 'bench/chat', provider: 'bench', usage: { input_tokens: 12, output_tokens: 9 }, cost: 0.0000048 },
              ),
            ),
          ),
        );
      }
    };
    for (const l of Object.values(ledgers)) await round(l); // warm-up
    const cpu: Record<string, number> = {};
    const names = Object.keys(servers);
    for (let r = 0; r < ROUNDS; r++) {
      for (let i = 0; i < names.length; i++) {
        const name = names[(r + i) % names.length];
        const before = cpuSeconds(servers[name].process.pid);
        await round(ledgers[name]);
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
      inserts_per_setup: Object.fromEntries(names.map((name) => [name, ledgers[name].writes])),
      rows,
    };
    const file = writeResult('ferretdb', result);
    for (const [name, row] of Object.entries(rows))
      console.log(`${name.padEnd(10)} GOGC ${row.gogc.padEnd(4)} ${row.cpu_us_per_record} µs of CPU a record, peak ${row.peak_rss_mb} MB`);
    console.log(`verdicts: ${JSON.stringify(verdicts)}`);
    console.log(`results: ${file}`);
    return result;
  } finally {
    await Promise.all(Object.values(ledgers).map((l) => l.close(1_000)));
    await Promise.all(Object.values(stores).map((s) => s.close()));
    await Promise.all(Object.values(servers).map((s) => s.process.stop()));
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
