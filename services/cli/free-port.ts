// A free loopback port, for processes this one starts (troupe up's extra instances, a local
// PostgreSQL, the tests' stacks). The kernel may give the same ephemeral port to two bind(0)
// calls once the first socket is closed; two services on one port would let the second fail to
// bind while the first answers for it. So a port is handed out once per process.
import net from "node:net";

const handedOut = new Set<number>();

export async function freePort(): Promise<number> {
  for (;;) {
    const port = await new Promise<number>((resolve, reject) => {
      const srv = net.createServer();
      srv.unref();
      srv.on("error", reject);
      srv.listen(0, "127.0.0.1", () => {
        const { port } = srv.address() as net.AddressInfo;
        srv.close(() => resolve(port));
      });
    });
    if (handedOut.has(port)) continue;
    handedOut.add(port);
    return port;
  }
}
