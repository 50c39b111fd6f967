// Where a webhook may go. A callback URL must be https, and it may not reach the gateway's own
// network: a URL whose host resolves to a loopback, private, link-local (cloud metadata), shared,
// multicast or unspecified address is refused, at create time and again at every connection (so
// a DNS answer that changes after the check cannot redirect a delivery inward). An IPv6 address
// that carries an IPv4 one (mapped, compatible, NAT64, 6to4, Teredo) is judged by that address too. Operators who want
// callbacks inside their own network set WEBHOOKS_ALLOW_PRIVATE_URLS=true, which also allows http.
import dns from 'node:dns';
import net from 'node:net';
import { BadRequestError } from '../../infrastructure/errors';

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

/** The 8 groups of an IPv6 address (a trailing dotted quad included), or null if it is not one. */
function ipv6Groups(address: string): number[] | null {
  if (!net.isIPv6(address)) return null;
  let text = address.replace(/%.*$/, '');
  const quad = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(text);
  if (quad) {
    const [a, b, c, d] = quad.slice(1).map(Number);
    text = `${text.slice(0, quad.index)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const [head, tail] = text.includes('::') ? text.split('::') : [text, null];
  const part = (x: string) => (x ? x.split(':').map((g) => parseInt(g, 16)) : []);
  const left = part(head);
  const right = tail === null ? [] : part(tail);
  return [...left, ...Array(8 - left.length - right.length).fill(0), ...right];
}

const dotted = (hi: number, lo: number) => `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`;

/**
 * The IPv4 address an IPv6 one carries, by the forms that reach it: IPv4-mapped (::ffff:0:0/96),
 * SIIT (::ffff:0:0:0/96), IPv4-compatible (::/96), NAT64 (64:ff9b::/96 and 64:ff9b:1::/48), 6to4
 * (2002::/16) and Teredo (2001::/32, the client address). Null when it carries none.
 */
function embeddedIPv4(g: number[]): string | null {
  const zeros = (from: number, to: number) => g.slice(from, to).every((x) => x === 0);
  if (zeros(0, 5) && g[5] === 0xffff) return dotted(g[6], g[7]);
  if (zeros(0, 4) && g[4] === 0xffff && g[5] === 0) return dotted(g[6], g[7]);
  if (zeros(0, 6) && (g[6] !== 0 || g[7] > 1)) return dotted(g[6], g[7]); // not :: or ::1
  if (g[0] === 0x64 && g[1] === 0xff9b && (zeros(2, 6) || g[2] === 1)) return dotted(g[6], g[7]);
  if (g[0] === 0x2002) return dotted(g[1], g[2]);
  if (g[0] === 0x2001 && g[1] === 0) return dotted(g[6] ^ 0xffff, g[7] ^ 0xffff);
  return null;
}

function isPrivateAddress(address: string): boolean {
  const groups = ipv6Groups(address);
  if (!groups) return blocked.check(address, 'ipv4');
  const inner = embeddedIPv4(groups);
  if (inner !== null && blocked.check(inner, 'ipv4')) return true;
  return blocked.check(address.replace(/%.*$/, ''), 'ipv6');
}

/** The host of `url` when it is an IP address that may not receive webhooks; null otherwise. */
export function refusedAddress(url: URL, allowPrivate: boolean): string | null {
  const host = url.hostname.replace(/^\[(.*)\]$/, '$1');
  return !allowPrivate && net.isIP(host) && isPrivateAddress(host) ? host : null;
}

/** The parsed URL when it may receive webhooks; a 400 naming the reason otherwise. */
export async function checkCallbackUrl(raw: string, allowPrivate: boolean, field = 'callback_url'): Promise<URL> {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new BadRequestError(`${field}: is not a URL`);
  }
  if (url.protocol !== 'https:' && !(allowPrivate && url.protocol === 'http:')) {
    throw new BadRequestError(`${field}: must be an https URL`);
  }
  if (url.username || url.password) throw new BadRequestError(`${field}: must not carry credentials`);
  if (allowPrivate) return url;
  const host = url.hostname.replace(/^\[(.*)\]$/, '$1');
  let addresses: string[];
  try {
    addresses = net.isIP(host) ? [host] : (await dns.promises.lookup(host, { all: true, verbatim: true })).map((a) => a.address);
  } catch {
    throw new BadRequestError(`${field}: host ${host} does not resolve`);
  }
  if (addresses.some(isPrivateAddress)) {
    throw new BadRequestError(`${field}: ${host} resolves to a private, loopback or link-local address`);
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
