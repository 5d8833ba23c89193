// What every route of the HTTP edge answers with: the request and response types of Node's HTTP/1
// and HTTP/2 compatibility servers (the edge serves both), one whole answer, and a stream of
// server-sent events.
import type http from "node:http";
import type { ConnectNodeAdapterOptions } from "@connectrpc/connect-node";

// connect-node's own request and response types, so that its adapter and the routes behind it agree.
type NodeHandler = NonNullable<ConnectNodeAdapterOptions["fallback"]>;
export type NodeServerRequest = Parameters<NodeHandler>[0];
export type NodeServerResponse = Parameters<NodeHandler>[1];

/** A whole answer; the HTTP/1 and HTTP/2 compatibility responses take the same calls. */
export function answer(
  res: NodeServerResponse,
  status: number,
  headers: http.OutgoingHttpHeaders,
  body: string | Buffer = "",
): void {
  (res as http.ServerResponse).writeHead(status, headers).end(body);
}

/** Starts a stream of server-sent events (200, text/event-stream, no caching), with `headers`. */
export function openEventStream(res: NodeServerResponse, headers: http.OutgoingHttpHeaders = {}): void {
  (res as http.ServerResponse).writeHead(200, {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    ...headers,
  });
}

/** Writes one server-sent event of JSON `data` (named `event` when given); waits while the client is slow. */
export async function writeEvent(res: NodeServerResponse, data: unknown, event?: string): Promise<void> {
  const text = `${event === undefined ? "" : `event: ${event}\n`}data: ${JSON.stringify(data)}\n\n`;
  if (!(res as http.ServerResponse).write(text)) await new Promise((r) => res.once("drain", r));
}
