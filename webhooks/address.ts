// Where a webhook may go. A callback URL must be https, and it may not reach the gateway's own
// network: a URL whose host resolves to a loopback, private, link-local (cloud metadata), shared,
// multicast or unspecified address is refused, at create time and again at every connection (so
// a DNS answer that changes after the check cannot redirect a delivery inward). Operators who want
// callbacks inside their own network set WEBHOOKS_ALLOW_PRIVATE_URLS=true, which also allows http.
import dns from 'node:dns';
import net from 'node:net';
import { BadRequestError } from '../errors';

const blocked = new net.BlockList();
for (const [range, bits] of [
  ['0.0.0.0', 8],
  ['10.0.0.0', 8],
  ['100.64.0.0', 10],
  ['127.0.0.0', 8],
  ['169.254.0.0', 16],
  ['172.16.0.0', 12],
  ['192.0.0.0', 24],
  ['192.168.0.0', 16],
  ['198.18.0.0', 15],
  ['224.0.0.0', 3],
] as const)
  blocked.addSubnet(range, bits, 'ipv4');
for (const [range, bits] of [
  ['::', 128],
  ['::1', 128],
  ['fc00::', 7],
  ['fe80::', 10],
  ['ff00::', 8],
] as const)
  blocked.addSubnet(range, bits, 'ipv6');

function isPrivateAddress(address: string): boolean {
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address);
  if (mapped) return blocked.check(mapped[1], 'ipv4');
  return blocked.check(address, net.isIPv6(address) ? 'ipv6' : 'ipv4');
}

/** The parsed URL when it may receive webhooks; a 400 naming the reason otherwise. */
export async function checkCallbackUrl(raw: string, allowPrivate: boolean): Promise<URL> {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new BadRequestError('callback_url: is not a URL');
  }
  if (url.protocol !== 'https:' && !(allowPrivate && url.protocol === 'http:')) {
    throw new BadRequestError('callback_url: must be an https URL');
  }
  if (url.username || url.password) throw new BadRequestError('callback_url: must not carry credentials');
  if (allowPrivate) return url;
  const host = url.hostname.replace(/^\[(.*)\]$/, '$1');
  let addresses: string[];
  try {
    addresses = net.isIP(host) ? [host] : (await dns.promises.lookup(host, { all: true, verbatim: true })).map((a) => a.address);
  } catch {
    throw new BadRequestError(`callback_url: host ${host} does not resolve`);
  }
  if (addresses.some(isPrivateAddress)) {
    throw new BadRequestError(`callback_url: ${host} resolves to a private, loopback or link-local address`);
  }
  return url;
}

/** A `lookup` for the delivery connection that refuses private addresses, so a DNS change after the check does not help. */
export function guardedLookup(allowPrivate: boolean): net.LookupFunction {
  return (hostname, options, callback) => {
    dns.lookup(hostname, { ...options, all: true }, (err, addresses) => {
      if (err) return callback(err, '', 4);
      const list = addresses as unknown as dns.LookupAddress[];
      const usable = allowPrivate ? list : list.filter((a) => !isPrivateAddress(a.address));
      if (!usable.length) return callback(new Error(`${hostname} resolves only to private addresses`), '', 4);
      if ((options as dns.LookupOptions).all) return (callback as unknown as (e: null, a: dns.LookupAddress[]) => void)(null, usable);
      callback(null, usable[0].address, usable[0].family);
    });
  };
}
