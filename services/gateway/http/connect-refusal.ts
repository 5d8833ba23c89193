// A call refused before its request is read, in the protocol the client spoke: how the HTTP edge
// (admission.ts) answers a Connect or gRPC-Web request whose credentials the gateway refuses, the
// way the gRPC port refuses one before decoding its message (shared/rpc/server.ts). Written from
// the protocols' published references, since connect-es exports its own writers only as
// internals: https://connectrpc.com/docs/protocol (unary errors, the end-of-stream message) and
// https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-WEB.md (a trailers-only response).
import type { NodeServerRequest, NodeServerResponse } from "./answer.js";

/** Connect's name and HTTP status for each gRPC code (connectrpc.com/docs/protocol#error-codes). */
const CODES: Record<number, [string, number]> = {
  1: ["canceled", 499],
  2: ["unknown", 500],
  3: ["invalid_argument", 400],
  4: ["deadline_exceeded", 504],
  5: ["not_found", 404],
  6: ["already_exists", 409],
  7: ["permission_denied", 403],
  8: ["resource_exhausted", 429],
  9: ["failed_precondition", 400],
  10: ["aborted", 409],
  11: ["out_of_range", 400],
  12: ["unimplemented", 501],
  13: ["internal", 500],
  14: ["unavailable", 503],
  15: ["data_loss", 500],
  16: ["unauthenticated", 401],
};

/** Answers the request with gRPC status `code` and `message`, reading none of its body. */
export function refuseCall(req: NodeServerRequest, res: NodeServerResponse, code: number, message: string): void {
  const contentType = String(req.headers["content-type"] ?? "");
  const [name, httpStatus] = CODES[code] ?? CODES[2];
  const out = res as unknown as {
    writeHead(status: number, headers: Record<string, string>): { end(body?: Buffer | string): void };
  };
  // The client may still be sending; the answer does not wait for it, and the rest is not read.
  req.resume();
  if (/^application\/grpc-web/i.test(contentType)) {
    // Trailers-only: the status in the headers and no body. grpc-message is percent-encoded.
    out
      .writeHead(200, {
        "content-type": contentType.split(";")[0],
        "grpc-status": String(code),
        "grpc-message": encodeURIComponent(message),
      })
      .end();
  } else if (/^application\/connect\+/i.test(contentType)) {
    // A stream: HTTP 200 and one end-of-stream message (flags 0x02), always JSON.
    const json = Buffer.from(JSON.stringify({ error: { code: name, message } }));
    const envelope = Buffer.alloc(5);
    envelope[0] = 0x02;
    envelope.writeUInt32BE(json.length, 1);
    out.writeHead(200, { "content-type": contentType.split(";")[0] }).end(Buffer.concat([envelope, json]));
  } else {
    // Unary (POST with application/json or application/proto, or GET): the code's HTTP status, a JSON body.
    out.writeHead(httpStatus, { "content-type": "application/json" }).end(JSON.stringify({ code: name, message }));
  }
}
