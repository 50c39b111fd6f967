// Which callback addresses are refused, IPv6 forms that carry an IPv4 address included, and the
// check a delivery makes itself (an address written in the URL is connected to without a lookup).
import { expect } from 'chai';
import { refusedAddress } from '../../domain/webhooks/address';
import { createWebhookSender } from '../../domain/webhooks/deliver';

const refused = (url: string) => refusedAddress(new URL(url), false);

describe('callback addresses', () => {
  it('refuses private and loopback addresses however an IPv6 address carries them', () => {
    for (const url of [
      'https://127.0.0.1/',
      'https://[::1]/',
      'https://[::ffff:127.0.0.1]/', // mapped (the URL parser writes it ::ffff:7f00:1)
      'https://[::ffff:a00:1]/', // mapped 10.0.0.1, in hex
      'https://[::127.0.0.1]/', // compatible
      'https://[::7f00:1]/',
      'https://[64:ff9b::127.0.0.1]/', // NAT64
      'https://[64:ff9b::a9fe:a9fe]/', // NAT64 of the metadata address 169.254.169.254
      'https://[64:ff9b:1::7f00:1]/', // local-use NAT64
      'https://[::ffff:0:127.0.0.1]/', // SIIT
      'https://[2002:7f00:1::]/', // 6to4
      'https://[2002:c0a8:1::1]/', // 6to4 of 192.168.0.1
      'https://[2001:0:4136:e378:8000:63bf:80ff:fffe]/', // Teredo, client 127.0.0.1
      'https://[fe80::1]/',
      'https://[fd00::1]/',
    ])
      expect(refused(url), url).to.not.equal(null);
  });

  it('lets public addresses and names through (names are checked when looked up)', () => {
    for (const url of ['https://93.184.216.34/', 'https://[2606:4700::6810:84e5]/', 'https://[2002:5db8:d822::1]/', 'https://example.com/'])
      expect(refused(url), url).to.equal(null);
    expect(refusedAddress(new URL('https://127.0.0.1/'), true)).to.equal(null);
  });

  it('a delivery to an address that reaches inside is refused before any connection', async () => {
    const sender = createWebhookSender(false);
    try {
      const out = await sender.send({ url: 'https://[64:ff9b::127.0.0.1]:1/hook', secret: 's', id: 'msg_1', body: '{}', timeoutMs: 1000 });
      expect(out).to.deep.equal({
        ok: false,
        status: null,
        error: 'refused: 64:ff9b::7f00:1 is a private, loopback or link-local address',
      });
    } finally {
      await sender.close();
    }
  });
});
