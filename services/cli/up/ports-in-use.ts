// Before `troupe up` starts anything: each address it will listen on must be free. A port held
// by another program (another `troupe up` on another data directory, say) used to make the
// service that wanted it fail at start, be restarted, and fail again, forever, with grpc-js's
// "No address added out of total 1 resolved" for a reason.
import net from "node:net";
import { splitHostPort } from "../../shared/net/host-port.js";

/** What listens where: a service's name and its address (host:port). */
export interface Listener {
  name: string;
  address: string;
}

/** The listeners whose address another process holds now (bound and listening, or bound). */
export async function inUse(listeners: readonly Listener[]): Promise<Listener[]> {
  const taken: Listener[] = [];
  for (const l of listeners) if (await held(l.address)) taken.push(l);
  return taken;
}

function held(address: string): Promise<boolean> {
  let host: string;
  let port: number;
  try {
    [host, port] = splitHostPort(address);
  } catch {
    return Promise.resolve(false); // not HOST:PORT (a unix socket): the service reports its own trouble
  }
  if (port === 0) return Promise.resolve(false);
  return new Promise((resolve) => {
    const probe = net.createServer();
    probe.unref();
    // Only "in use" is a finding: an address this machine does not have is the service's to report.
    probe.once("error", (err: NodeJS.ErrnoException) => resolve(err.code === "EADDRINUSE"));
    probe.listen({ port, host, exclusive: true }, () => probe.close(() => resolve(false)));
  });
}

/** The error `troupe up` stops with, naming each address and how to move it. */
export function inUseMessage(taken: readonly Listener[]): string {
  const list = taken.map((l) => `${l.address} (${l.name})`).join(", ");
  return (
    `cannot start: ${list} ${taken.length > 1 ? "are" : "is"} already in use. ` +
    "Is another troupe up running, on another data directory? Stop it, or give this one other " +
    "addresses: --gateway, --router, --runner, --memory, --sandbox, --model-server and --http " +
    "HOST:PORT, or TROUPE_<NAME>_ADDR (troupe up --help)."
  );
}
