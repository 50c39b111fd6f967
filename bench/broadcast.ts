// What a trace destination that is down or slow costs requests: the same chat completion through
// four gateways on one stack: one without a trace destination (what tracing costs at all), one
// whose destination answers at once (up: the baseline), one whose destination refuses connections
// (down) and one whose destination accepts and never answers (slow), taking turns in rounds at c=1
// and c=50; then how many spans each exported, failed or dropped (/metrics).
import http from 'node:http';
import os from 'node:os';
import type { AddressInfo } from 'node:net';
import { benchKey, loadSamples, measuredInRounds, startStack, writeResult } from './harness';

const BARS = { added_p50_ms_at_c1: 0.1, rps_ratio_at_c50: 0.9 };
const TOTALS: Record<number, number> = { 1: 2000, 50: 10_000 };
const ROUNDS = 4;
const WARM_UP = 4000;

/** An OTLP endpoint that takes every export at once (`answer`), or takes connections and never answers. */
async function receiver(answer: boolean): Promise<{ url: string; close: () => void }> {
  const held: http.ServerResponse[] = [];
  const server = http.createServer((req, res) => {
    if (!answer) return void held.push(res);
    req.resume();
    req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end('{}'));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1/traces`,
    close: () => {
      for (const r of held) r.destroy();
      server.close();
    },
  };
}

export async function benchBroadcast() {
  const [up, slow] = await Promise.all([receiver(true), receiver(false)]);
  const stack = await startStack(
    {},
    {
      gateways: {
        none: {},
        up: { OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: up.url, OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT: 'true' },
        down: {
          OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'http://127.0.0.1:9/v1/traces',
          OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT: 'true',
        },
        slow: { OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: slow.url, OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT: 'true' },
      },
    },
  );
  try {
    const key = await benchKey(stack);
    const headers = { authorization: `Bearer ${key}` };
    const body = {
      model: 'sandbox/chat-1',
      messages: [{ role: 'user', content: 'Say this is a test' }],
      max_tokens: 16,
      provider: { only: ['sandbox-alpha'] },
    };
    const names = Object.keys(stack.gatewayUrls);
    const url = (name: string) => `${stack.gatewayUrls[name]}/api/v1/chat/completions`;
    for (const name of names) await loadSamples(url(name), body, headers, 8, WARM_UP);

    const rows: Record<string, any>[] = [];
    for (const concurrency of [1, 50]) {
      const targets = Object.fromEntries(
        names.map((n) => [n, { url: url(n), headers, body, requests: TOTALS[concurrency], ok: (t: string) => t.includes('"choices"') }]),
      );
      rows.push({ concurrency, ...(await measuredInRounds(stack, targets, concurrency, ROUNDS)) });
    }
    // Let the exports settle (a failed one takes up to its 5 s timeout), then read what each gateway counted.
    await new Promise((r) => setTimeout(r, 7_000));
    const spans: Record<string, Record<string, number>> = {};
    for (const name of names) {
      const text = await (await fetch(`${stack.gatewayUrls[name]}/metrics`)).text();
      spans[name] = Object.fromEntries(
        [...text.matchAll(/gateway_trace_spans_total\{destination="global",outcome="(\w+)"\} (\d+)/g)].map((m) => [m[1], Number(m[2])]),
      );
    }
    const c1 = rows.find((r) => r.concurrency === 1)!;
    const c50 = rows.find((r) => r.concurrency === 50)!;
    const verdicts = Object.fromEntries(
      ['down', 'slow'].flatMap((n) => [
        // Against a destination that is up: what being down or slow adds, not what tracing costs.
        [`${n}_added_p50_at_c1`, c1[n].p50_ms - c1.up.p50_ms <= BARS.added_p50_ms_at_c1],
        [`${n}_rps_at_c50`, c50[n].rps >= c50.up.rps * BARS.rps_ratio_at_c50 && c50[n].errors === 0],
      ]),
    );
    const result = {
      benchmark: 'broadcast',
      at: new Date().toISOString(),
      machine: { cpus: os.cpus().length, node: process.version },
      bars: BARS,
      verdicts,
      rows,
      spans,
    };
    const file = writeResult('broadcast', result);
    console.log('\n   c | destination | req/s   | p50 / p99 ms    | errors');
    for (const r of rows)
      for (const n of names)
        console.log(
          `${String(r.concurrency).padStart(4)} | ${n.padEnd(11)} | ${String(r[n].rps).padEnd(7)} | ${`${r[n].p50_ms} / ${r[n].p99_ms}`.padEnd(15)} | ${r[n].errors}`,
        );
    console.log(`spans (global destination): ${JSON.stringify(spans)}`);
    console.log(`verdicts: ${JSON.stringify(verdicts)}`);
    console.log(`results: ${file}`);
    return result;
  } finally {
    await stack.stop();
    up.close();
    slow.close();
  }
}
