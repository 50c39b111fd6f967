import { expect } from 'chai';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { clientConfig, ConfigError, defaultMaxConnections, loadConfig } from '../../infrastructure/config';

const root = path.resolve(__dirname, '..', '..', '..');

describe('config', () => {
  it('defaults to the embedded stack on loopback', () => {
    const c = loadConfig({ HOME: '/home/u' });
    expect(c.port).to.equal(8080);
    expect(c.host).to.equal('127.0.0.1');
    expect(c.mongo.uri).to.equal(undefined);
    expect(c.temporal.address).to.equal(undefined);
    expect(c.temporal.uiPort).to.equal(8233);
    expect(c.dataDir).to.equal(path.resolve('.data'));
    expect(c.toolsDir).to.equal('/home/u/.cache/inference-gateway/bin');
    expect(c.apiProcesses).to.equal(Math.min(os.availableParallelism(), 4));
    expect(loadConfig({ API_PROCESSES: '3' }).apiProcesses).to.equal(3);
    expect(c.http.acceptors).to.equal(16);
  });

  it("limits a workspace's requests over all its keys to ten keys' worth unless told otherwise", () => {
    expect(loadConfig({}).rateLimit).to.include({ requests: 600, workspaceRequests: 6_000 });
    expect(loadConfig({ RATE_LIMIT_REQUESTS: '50' }).rateLimit).to.include({ requests: 50, workspaceRequests: 500 });
    expect(loadConfig({ RATE_LIMIT_WORKSPACE_REQUESTS: '70' }).rateLimit).to.include({ requests: 600, workspaceRequests: 70 });
  });

  it('the variables it reads are exactly the documented ones', () => {
    // Which variables the config module reads, observed rather than parsed from its source.
    const read = new Set<string>();
    const spy = new Proxy({} as Record<string, string | undefined>, {
      get: (_t, name) => {
        if (typeof name === 'string' && /^[A-Z][A-Z0-9_]+$/.test(name)) read.add(name);
        return undefined;
      },
      ownKeys: () => [],
    });
    loadConfig(spy);
    clientConfig(spy);
    for (const convention of ['HOME', 'XDG_CACHE_HOME']) read.delete(convention); // where the tools cache goes
    const doc = fs.readFileSync(path.join(root, 'docs', 'configuration.md'), 'utf8');
    const documented = new Set([...doc.matchAll(/^\| `([A-Z][A-Z0-9_]+)` \|/gm)].map((m) => m[1]));
    expect([...read].sort()).to.deep.equal([...documented].sort());
  });

  it('reads every documented variable', () => {
    const c = loadConfig({
      PORT: '9000',
      MONGODB_URI: 'mongodb://db:27017/',
      TEMPORAL_ADDRESS: 'temporal:7233',
      LOG_LEVEL: 'debug',
      BODY_LIMIT: '2mb',
      DATA_DIR: '/tmp/x',
      TOOLS_DIR: '/opt/tools',
      TEMPORAL_TASK_QUEUE: 'q',
      MONGODB_DATABASE: 'g2',
    });
    expect(c.port).to.equal(9000);
    expect(c.mongo.uri).to.equal('mongodb://db:27017/');
    expect(c.mongo.database).to.equal('g2');
    expect(c.temporal.address).to.equal('temporal:7233');
    expect(c.temporal.taskQueue).to.equal('q');
    expect(c.logLevel).to.equal('debug');
    expect(c.http.bodyLimitBytes).to.equal(2 * 1024 * 1024);
    expect(c.dataDir).to.equal('/tmp/x');
    expect(c.toolsDir).to.equal('/opt/tools');
  });

  it("keeps client connections under the process's open-file limit, with a reserve for its own work", () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'limits-'));
    const limits = (soft: string) => {
      const file = path.join(dir, soft);
      fs.writeFileSync(
        file,
        `Limit                     Soft Limit           Hard Limit           Units\nMax open files            ${soft}                1048576              files\n`,
      );
      return file;
    };
    expect(defaultMaxConnections(limits('20000'))).to.equal(15_000); // a quarter kept
    expect(defaultMaxConnections(limits('1024'))).to.equal(768); // at least 256 kept
    expect(defaultMaxConnections(limits('unlimited'))).to.equal(3_072); // as where the limit cannot be read
    expect(defaultMaxConnections(path.join(dir, 'missing'))).to.equal(3_072);
    expect(loadConfig({ MAX_CONNECTIONS: '500' }).http.maxConnections).to.equal(500);
    fs.rmSync(dir, { recursive: true });
  });

  const invalid: [string, string][] = [
    ['PORT', 'eighty'],
    ['PORT', '70000'],
    ['PORT', '0'],
    ['TEMPORAL_PORT', '-1'],
    ['LOG_LEVEL', 'loud'],
    ['MONGODB_URI', 'http://db'],
    ['MONGODB_URI', 'not a url'],
    ['TEMPORAL_ADDRESS', 'no-port'],
    ['BODY_LIMIT', 'ten'],
    ['SHUTDOWN_GRACE_MS', '0'],
    ['API_PROCESSES', '0'],
    ['HTTP_ACCEPTORS', '0'],
    ['MAX_CONNECTIONS', '0'],
    ['RATE_LIMIT_WORKSPACE_REQUESTS', '0'],
    ['HTTP_ACCEPTORS', '65'], // each descriptor is woken by every new connection
    ['BATCH_HEARTBEAT_TIMEOUT_MS', '1000'], // chunks heartbeat every second: a shorter timeout would move healthy chunks
  ];
  for (const [name, value] of invalid) {
    it(`rejects ${name}=${value} with a message naming the variable`, () => {
      expect(() => loadConfig({ [name]: value })).to.throw(ConfigError, name);
    });
  }

  it('never echoes a database password in its error', () => {
    try {
      loadConfig({ MONGODB_URI: 'http://admin:s3cret@db/' });
      expect.fail('should throw');
    } catch (err) {
      expect((err as Error).message)
        .to.include('MONGODB_URI')
        .and.not.include('s3cret');
    }
  });
});
