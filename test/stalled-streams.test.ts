// Clients that open streams and stop reading them. Each such stream holds a slot of its provider's
// concurrency limit while it is stalled: one workspace holds at most its share of those slots (the
// others keep a quarter), and a client that reads nothing for `stallMs` is cut off, its output
// billed and its slot freed. Before, 100 stalled streams of one workspace held all of a provider's
// slots, and every other workspace's call to it waited out the provider's timeout and got a 503.
import http from 'node:http';
import { expect } from 'chai';
import { usageDetails } from '../domain/accounts/usage-ledger';
import { endpointEntry, modelEntry, providerEntry } from '../domain/catalog/entries';
import { call, createTenant, startTestGateway, storedRecord, uniqueName, writeTestCatalog, type Tenant, type TestGateway } from './helpers';

const run = uniqueName('stall');
const STALL_MS = 8_000;

/**
 * A streamed call whose client reads its first piece and then nothing more, keeping the connection
 * open. A paused client does not see the connection close either (it reads nothing): `resume` reads
 * on, and resolves with the rest once the connection is over.
 */
function stalledStream(url: string, key: string): Promise<{ id: string; resume: () => Promise<string> }> {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' } });
    req.on('error', reject);
    req.on('response', (res) => {
      if (res.statusCode !== 200) {
        let text = '';
        res.on('data', (c: Buffer) => (text += c));
        return res.on('end', () => reject(new Error(`${res.statusCode} ${text}`)));
      }
      const rest: Buffer[] = [];
      const over = new Promise<string>((done) => {
        res.on('close', () => done(Buffer.concat(rest).toString()));
        res.on('error', () => undefined); // a connection cut mid-answer: what the test expects
      });
      res.once('data', () => {
        res.pause();
        resolve({
          id: String(res.headers['x-generation-id']),
          resume: () => {
            res.on('data', (c: Buffer) => rest.push(c));
            res.resume();
            return over;
          },
        });
      });
    });
    req.end(
      JSON.stringify({ model: 'test/narrow', messages: [{ role: 'user', content: 'everything' }], max_tokens: 150_000, stream: true }),
    );
  });
}

describe('stalled streams', function () {
  this.timeout(60_000);
  let gw: TestGateway;
  let hog: Tenant;
  let other: Tenant;
  const url = (p: string) => `${gw.url}/api/v1${p}`;
  const ask = (key: string) =>
    call(url('/chat/completions'), { key, body: { model: 'test/narrow', messages: [{ role: 'user', content: 'hi' }], max_tokens: 5 } });

  before(async () => {
    const catalog = writeTestCatalog('stalled', (c) => {
      // 4 slots per process: one workspace may hold 3. A long answer, so a stalled reader's buffers fill.
      c.providers.push(
        providerEntry('narrow', `\${SANDBOX_URL}/~run=${run},max_words=150000/openai/v1`, { max_concurrency: 4, timeout_ms: 3_000 }),
      );
      c.models.push(modelEntry('test/narrow', [endpointEntry('narrow', 0.1, { supported_parameters: ['max_tokens'] })]));
      // 4 slots again, answers that take 1 s: calls that end by themselves.
      c.providers.push(
        providerEntry('narrow-slow', `\${SANDBOX_URL}/~run=${run},latency=1000/openai/v1`, { max_concurrency: 4, timeout_ms: 5_000 }),
      );
      c.models.push(modelEntry('test/narrow-slow', [endpointEntry('narrow-slow', 0.1, { supported_parameters: ['max_tokens'] })]));
    });
    gw = await startTestGateway({ env: { CATALOG_PATH: catalog }, tune: (c) => (c.inference.stallMs = STALL_MS) });
    hog = await createTenant(gw.store, 50);
    other = await createTenant(gw.store, 50);
  });

  after(async () => {
    await gw?.stop();
  });

  it("one workspace's stalled streams leave the others a share of the provider; a reader that stalls is cut off, billed, and its slot freed", async () => {
    const opened = Date.now();
    // The hog opens four: three get the slots of its share (3 of 4); the fourth waits out the
    // provider's timeout and is told why.
    const tries = await Promise.allSettled([1, 2, 3, 4].map(() => stalledStream(url('/chat/completions'), hog.inferenceKey)));
    const stalled = tries.flatMap((t) => (t.status === 'fulfilled' ? [t.value] : []));
    const refused = tries.flatMap((t) => (t.status === 'rejected' ? [(t.reason as Error).message] : []));
    expect(stalled).to.have.length(3);
    expect(refused).to.have.length(1);
    expect(refused[0]).to.match(/^503 .*This workspace holds its share of provider narrow's concurrency limit \(3 of 4 per process\)/);
    // The slot it left is another workspace's to take, at once.
    const served = await ask(other.inferenceKey);
    expect(served.status, JSON.stringify(served.body)).to.equal(200);
    await gw.usage.flushed();
    for (const { id } of stalled) expect(await storedRecord(gw.store, id), 'the stalled streams still run meanwhile').to.equal(null);

    // The stalled readers are cut off once they have read nothing for STALL_MS, each billed once for
    // what was produced before it stalled.
    for (const { id } of stalled) {
      let record = null;
      for (let i = 0; i < 200 && !record; i++) {
        await gw.usage.flushed();
        record = await storedRecord(gw.store, id);
        if (!record) await new Promise((r) => setTimeout(r, 100));
      }
      expect(record, `usage record of ${id}`).to.not.equal(null);
      expect(usageDetails(record!)?.ending).to.equal('client_closed');
      expect(record!.output_tokens).to.be.within(1, 149_999);
    }
    expect(Date.now() - opened).to.be.at.least(STALL_MS);
    // What the clients find when they read on: their answers end short, without the closing [DONE].
    for (const s of stalled) expect(await s.resume()).to.not.include('[DONE]');
    // Their slots are free again: the hog is served too.
    const after = await ask(hog.inferenceKey);
    expect(after.status, JSON.stringify(after.body)).to.equal(200);
  });

  it('calls that end by themselves are not held to the share: one workspace may use every slot', async () => {
    const started = Date.now();
    const answers = await Promise.all(
      [1, 2, 3, 4].map((i) =>
        call(url('/chat/completions'), {
          key: hog.inferenceKey,
          body: { model: 'test/narrow-slow', messages: [{ role: 'user', content: `call ${i}` }], max_tokens: 5 },
        }),
      ),
    );
    for (const a of answers) expect(a.status, JSON.stringify(a.body)).to.equal(200);
    // All four at once take one answer's time (1 s); held to 3 slots, the fourth would wait for a second one.
    expect(Date.now() - started).to.be.below(1_800);
  });
});
