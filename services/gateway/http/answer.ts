// What every route of the HTTP edge answers with: the request and response types of Node's HTTP/1
// and HTTP/2 compatibility servers (the edge serves both), and one whole answer.
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
