// HOST:PORT as the address settings spell it ([::1]:8080 for IPv6), split for net's listen().
export function splitHostPort(address: string): [string, number] {
  const i = address.lastIndexOf(":");
  const port = Number(address.slice(i + 1));
  if (i <= 0 || !Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`"${address}" is not HOST:PORT`);
  return [address.slice(0, i).replace(/^\[|\]$/g, ""), port];
}
