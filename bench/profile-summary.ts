// Summarises a V8 CPU profile (`node --cpu-prof`, as `BENCH_CPU_PROF=<dir> npm run bench` writes
// for each gateway) as the functions with the most self time, in percent of the busy (non-idle) time:
//   node dist/bench/profile-summary.js <file.cpuprofile> [top]
import fs from 'node:fs';
import path from 'node:path';

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  hitCount?: number;
}

export function topSelfTime(file: string, top = 15): { name: string; where: string; percent: number }[] {
  const profile = JSON.parse(fs.readFileSync(file, 'utf8')) as { nodes: ProfileNode[]; samples: number[] };
  const counts = new Map<number, number>();
  for (const id of profile.samples) counts.set(id, (counts.get(id) ?? 0) + 1);
  const byFunction = new Map<string, { name: string; where: string; hits: number }>();
  let total = 0;
  for (const n of profile.nodes) {
    const hits = counts.get(n.id) ?? 0;
    const { functionName, url, lineNumber } = n.callFrame;
    if (functionName === '(idle)') continue;
    total += hits;
    const where = url
      ? `${url
          .replace(/^file:\/\//, '')
          .replace(/^.*node_modules\//, '')
          .replace(`${process.cwd()}/`, '')}:${lineNumber + 1}`
      : '';
    const key = `${functionName}|${where}`;
    const e = byFunction.get(key) ?? { name: functionName || '(anonymous)', where, hits: 0 };
    e.hits += hits;
    byFunction.set(key, e);
  }
  return [...byFunction.values()]
    .sort((a, b) => b.hits - a.hits)
    .slice(0, top)
    .map((e) => ({ name: e.name, where: e.where, percent: Math.round((e.hits / total) * 1000) / 10 }));
}

if (require.main === module) {
  const [file, top] = process.argv.slice(2);
  if (!file) throw new Error('usage: profile-summary <file.cpuprofile> [top]');
  console.log(path.basename(file));
  for (const e of topSelfTime(file, Number(top ?? 15))) console.log(`${String(e.percent).padStart(5)}%  ${e.name}  ${e.where}`);
}
