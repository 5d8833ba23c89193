// The one check every request of the HTTP edge passes before anything reads its body: the API key,
// from the headers alone, by the gRPC server's own authenticator. Routes anyone may call are named
// here (liveness, and what the edge is told is public: the console's files); every other route,
// today's and any added later, is refused without a valid key, in its own protocol's words, with
// its body left unread (drained, bounded by the connection guard's body deadline).
import type { Authenticator } from "../../shared/auth/auth.js";
import { toStatus } from "../../shared/errors.js";
import { refuseCall } from "./connect-refusal.js";
import { answer, type NodeServerRequest, type NodeServerResponse } from "./answer.js";
import { forwardedMetadata } from "./metadata.js";
import { apiErrorOf, sendError } from "./openai-request.js";

/** The Connect routes' paths: the two services' methods, as the gRPC port names them. */
export const CONNECT_ROUTE = /^\/troupe\.v1\.(GatewayService|AdminService)\//;

export type Admission = (req: NodeServerRequest, res: NodeServerResponse, closeAfter?: boolean) => boolean;

/**
 * True when the request may go on; otherwise it has been answered (401 with the reason, in the
 * protocol of its route). `closeAfter`: the client waits for `100 Continue` and will not send its
 * body, so the connection cannot carry another request and is closed after the answer.
 */
export function admission(authenticate: Authenticator, isPublic: (req: NodeServerRequest) => boolean): Admission {
  return (req, res, closeAfter = false) => {
    const pathname = (req.url ?? "").split("?")[0];
    if (pathname === "/healthz" || pathname === "/readyz" || isPublic(req)) return true;
    try {
      // A copy: the check rewrites what it is given, and each call builds its own.
      authenticate(forwardedMetadata(req.headers), pathname);
      return true;
    } catch (err) {
      const { code, details } = toStatus(err);
      // The client may still be sending: the answer does not wait, and the rest is discarded.
      req.resume();
      if (closeAfter && "setHeader" in res && !("stream" in res)) res.setHeader("connection", "close");
      if (CONNECT_ROUTE.test(pathname)) refuseCall(req, res, code, details);
      else if (pathname.startsWith("/v1/")) sendError(res, apiErrorOf(err));
      else
        answer(
          res,
          401,
          // An MCP host (and any HTTP client) learns the scheme it must use.
          { "content-type": "application/json", "www-authenticate": 'Bearer realm="troupe"' },
          JSON.stringify({ code: "unauthenticated", message: details }),
        );
      return false;
    }
  };
}
