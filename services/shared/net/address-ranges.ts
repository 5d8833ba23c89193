// Which addresses an agent's requests may reach: the ranges that are not public, checked with
// node's BlockList. Kept apart from net-guard.ts so configuration can check a CIDR without
// loading the HTTP client.
import { BlockList, isIP } from "node:net";

// Not public: everything IANA lists as not globally reachable, plus the whole of the embedding
// ranges (mapped, compatible, NAT64, 6to4, Teredo) so no IPv4 address sneaks in dressed as IPv6.
const V4_BLOCKED = [
  "0.0.0.0/8", // "this network"; 0.0.0.0 reaches the host itself on Linux
  "10.0.0.0/8",
  "100.64.0.0/10", // CGNAT; Alibaba Cloud's metadata is 100.100.100.200
  "127.0.0.0/8",
  "169.254.0.0/16", // link-local; cloud metadata at 169.254.169.254
  "172.16.0.0/12",
  "192.0.0.0/24",
  "192.0.2.0/24",
  "192.88.99.0/24",
  "192.168.0.0/16",
  "198.18.0.0/15",
  "198.51.100.0/24",
  "203.0.113.0/24",
  "224.0.0.0/4", // multicast
  "240.0.0.0/4", // reserved, and 255.255.255.255
];
const V6_BLOCKED = [
  "::/96", // unspecified, loopback and IPv4-compatible
  "::ffff:0:0/96", // IPv4-mapped
  "64:ff9b::/96", // NAT64
  "64:ff9b:1::/48",
  "100::/64", // discard
  "2001::/23", // IETF protocol assignments, Teredo among them
  "2001:db8::/32", // documentation
  "2002::/16", // 6to4
  "fc00::/7", // unique local; AWS's IPv6 metadata is fd00:ec2::254
  "fe80::/10", // link-local
  "fec0::/10", // old site-local
  "ff00::/8", // multicast
];

/** A range as a.b.c.d/n or v6/n. */
export function isCidr(text: string): boolean {
  const [net, bits, ...rest] = text.split("/");
  const family = isIP(net ?? "");
  return family !== 0 && rest.length === 0 && /^\d{1,3}$/.test(bits ?? "") && Number(bits) <= (family === 6 ? 128 : 32);
}

export function blockList(ranges: readonly string[]): BlockList {
  const list = new BlockList();
  for (const cidr of ranges) {
    if (!isCidr(cidr)) throw new Error(`${cidr} is not a CIDR range`);
    const [net, bits] = cidr.split("/");
    list.addSubnet(net, Number(bits), isIP(net) === 6 ? "ipv6" : "ipv4");
  }
  return list;
}

const BLOCKED = blockList([...V4_BLOCKED, ...V6_BLOCKED]);
/** Names that mean this machine or a cloud's metadata service whatever a resolver says. */
export const BLOCKED_NAMES = /^(localhost|.*\.localhost|metadata\.google\.internal|metadata)$/;

/** Why an address may not be reached, or undefined when it may. */
export function addressRefusal(address: string, allow: BlockList): string | undefined {
  const family = isIP(address);
  if (family === 0) return `${address} is not an IP address`;
  const type = family === 6 ? "ipv6" : "ipv4";
  if (allow.check(address, type)) return undefined;
  return BLOCKED.check(address, type) ? `${address} is not a public address` : undefined;
}
