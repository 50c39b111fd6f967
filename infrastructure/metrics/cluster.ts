// Metrics across API processes sharing one port (node:cluster). A scrape reaches one process, so
// each answers with the sum over all of them: it asks the primary, which gathers every process's
// registry through prom-client's aggregator and sends the text back. Counters and histograms add
// up; each process's share of the requests is `gateway_api_process_requests{process}`.
import cluster from 'node:cluster';
import { AggregatorRegistry, Gauge, type Registry } from 'prom-client';

const ASK = 'gateway:metrics?';
const ANSWER = 'gateway:metrics';

interface Answer {
  type: typeof ANSWER;
  id: number;
  text?: string;
  error?: string;
}

/** In the primary: answers every process's request for the whole cluster's metrics. */
export function serveClusterMetrics(): void {
  const aggregator = new AggregatorRegistry();
  cluster.on('message', (worker, message: { type?: string; id?: number }) => {
    if (message?.type !== ASK) return;
    aggregator.clusterMetrics().then(
      (text) => worker.isConnected() && worker.send({ type: ANSWER, id: message.id, text }),
      (err: Error) => worker.isConnected() && worker.send({ type: ANSWER, id: message.id, error: err.message }),
    );
  });
}

/**
 * In a process under a primary: `registry` is what this process adds to the sum; an API process's
 * requests are counted as process `index`. Returns how to read the sum.
 */
export function joinClusterMetrics(registry: Registry, index: number, requests: (() => Promise<number>) | null): () => Promise<string> {
  if (requests) {
    new Gauge({
      name: 'gateway_api_process_requests',
      help: 'HTTP requests answered by each API process sharing the port, since it started',
      labelNames: ['process'] as const,
      registers: [registry],
      async collect() {
        this.set({ process: String(index) }, await requests());
      },
    });
  }
  AggregatorRegistry.setRegistries([registry]);
  // Its constructor installs the listener that answers the primary's requests.
  new AggregatorRegistry();
  const waiting = new Map<number, { resolve: (text: string) => void; reject: (err: Error) => void }>();
  let next = 0;
  process.on('message', (message: Answer) => {
    if (message?.type !== ANSWER) return;
    const w = waiting.get(message.id);
    if (!w) return;
    waiting.delete(message.id);
    if (message.error !== undefined) w.reject(new Error(`metrics of the other API processes: ${message.error}`));
    else w.resolve(message.text ?? '');
  });
  return () =>
    new Promise<string>((resolve, reject) => {
      const id = next++;
      waiting.set(id, { resolve, reject });
      process.send!({ type: ASK, id });
    });
}
