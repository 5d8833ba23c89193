// A CONNECT tunnel through an HTTP proxy (RFC 9110 §9.3.6), for connections that are not HTTP
// requests of ours: the sandbox's egress proxy chains what commands send through the deployment's
// proxy this way (services/sandbox/egress-proxy.ts). The tunnel is asked for an address and a
// port, the one the SSRF guard checked, never a name the proxy would resolve again.
import { connect, isIP, type Socket } from "node:net";
import { connect as connectTls } from "node:tls";

/** The proxy's answer head may be no longer than this. */
const HEAD_LIMIT = 16 * 1024;

/**
 * A socket to `address`:`port` through `proxyUrl` (http:// or https://, credentials in it sent as
 * Basic Proxy-Authorization). Resolves once the proxy answered 200; bytes after its answer's head
 * are the far end's and stay in the socket. Rejects with an Error saying why (the proxy's status
 * when it refused).
 */
export function connectThrough(proxyUrl: string, address: string, port: number, timeoutMs: number): Promise<Socket> {
  const proxy = new URL(proxyUrl);
  const secure = proxy.protocol === "https:";
  const proxyPort = Number(proxy.port || (secure ? 443 : 80));
  const proxyHost = proxy.hostname.replace(/^\[|\]$/g, "");
  const authority = `${isIP(address) === 6 ? `[${address}]` : address}:${port}`;
  return new Promise((resolve, reject) => {
    const socket = secure
      ? connectTls({ host: proxyHost, port: proxyPort, servername: isIP(proxyHost) ? undefined : proxyHost })
      : connect({ host: proxyHost, port: proxyPort });
    let head = Buffer.alloc(0);
    const fail = (err: Error) => {
      clearTimeout(timer);
      socket.destroy();
      reject(err);
    };
    const timer = setTimeout(
      () => fail(new Error(`the proxy did not open a tunnel within ${timeoutMs} ms`)),
      timeoutMs,
    );
    const onData = (chunk: Buffer) => {
      head = Buffer.concat([head, chunk]);
      const end = head.indexOf("\r\n\r\n");
      if (end < 0) {
        if (head.length > HEAD_LIMIT) fail(new Error("the proxy's answer has no end"));
        return;
      }
      socket.off("data", onData);
      socket.pause();
      const status = /^HTTP\/1\.[01] (\d{3})/.exec(head.subarray(0, end).toString("latin1"));
      if (!status) return fail(new Error("the proxy's answer is not HTTP"));
      if (status[1] !== "200") return fail(new Error(`the proxy refused the tunnel (HTTP ${status[1]})`));
      clearTimeout(timer);
      socket.off("error", fail);
      const rest = head.subarray(end + 4);
      if (rest.length > 0) socket.unshift(rest);
      resolve(socket);
    };
    socket.once("error", fail);
    socket.on("data", onData);
    socket.once(secure ? "secureConnect" : "connect", () => {
      const credentials =
        proxy.username !== ""
          ? `Proxy-Authorization: Basic ${Buffer.from(`${decodeURIComponent(proxy.username)}:${decodeURIComponent(proxy.password)}`).toString("base64")}\r\n`
          : "";
      socket.write(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n${credentials}\r\n`);
    });
  });
}
