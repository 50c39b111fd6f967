import { expect } from 'chai';
import fs from 'node:fs';
import net from 'node:net';
import { freePort } from '../../devstack/processes';

describe('freePort', () => {
  it('answers ports below the ephemeral range (which outgoing connections take), each one bindable', async () => {
    const low = Number(fs.readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]);
    const ports = await Promise.all(Array.from({ length: 20 }, () => freePort()));
    for (const port of ports) {
      expect(port).to.be.at.least(10_000).and.below(low);
      const srv = net.createServer();
      await new Promise<void>((resolve, reject) => srv.once('error', reject).listen(port, '127.0.0.1', resolve));
      await new Promise((r) => srv.close(r));
    }
  });

  it('never answers one port twice in a process, though each is free again once checked', async () => {
    // 1,000 draws from ~22,000 ports repeat one ~20 times by chance: without the record this fails.
    const ports: number[] = [];
    for (let i = 0; i < 1_000; i++) ports.push(await freePort());
    expect(new Set(ports).size).to.equal(ports.length);
  });
});
