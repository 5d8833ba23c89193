// The HTTP side of adapters a platform calls (webhook, Slack's Events API): POSTs to one path,
// bodies up to a cap read whole (signatures are over the raw bytes), JSON answers.
import http from "node:http";
import { splitHostPort } from "../shared/net/host-port.js";
import { failure, type Logger } from "../shared/process/log.js";

export interface InboundAnswer {
  status: number;
  body: object;
  headers?: Record<string, string>;
}

export type InboundHandler = (raw: Buffer, req: http.IncomingMessage) => Promise<InboundAnswer>;

const MAX_BODY_BYTES = 1024 * 1024;

/** Serves POST `path` on `listen` (host:port; port 0 picks one) until closed. */
export async function serveInbound(listen: string, path: string, handle: InboundHandler, logger: Logger) {
  const server = http.createServer((req, res) => {
    const send = ({ status, body, headers }: InboundAnswer) =>
      res.writeHead(status, { "content-type": "application/json", ...headers }).end(JSON.stringify(body));
    if (req.url !== path) return send({ status: 404, body: { error: `not found: POST ${path}` } });
    if (req.method !== "POST") return send({ status: 405, body: { error: "POST only" }, headers: { allow: "POST" } });
    const chunks: Buffer[] = [];
    let size = 0;
    req.on("data", (c: Buffer) => {
      size += c.length;
      if (size <= MAX_BODY_BYTES) chunks.push(c);
    });
    req.on("end", () => {
      if (size > MAX_BODY_BYTES)
        return send({ status: 413, body: { error: `the body is over ${MAX_BODY_BYTES} bytes` } });
      handle(Buffer.concat(chunks), req).then(send, (err) => {
        logger.error("an inbound request failed", failure(err));
        send({ status: 500, body: { error: "internal error" } });
      });
    });
  });
  const [host, port] = splitHostPort(listen);
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => resolve());
  });
  return {
    port: (server.address() as { port: number }).port,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}
