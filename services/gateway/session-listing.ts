// Every session a caller owns, from every runner's store: what ListSessions pages through and
// what SubscribeInbox watches for new activity.
import { unavailable } from "../shared/errors.js";
import type { RouterService } from "../shared/gen/troupe/v1/router_pb.js";
import type { SessionInfo } from "../shared/gen/troupe/v1/session_pb.js";
import type { grpc, ServiceClient } from "../shared/rpc.js";
import type { RunnerPool } from "./placement.js";

type RouterClient = ServiceClient<(typeof RouterService)["method"]>;

/** The caller's sessions by id (`caller` is the metadata that names them to runners); UNAVAILABLE with no runner. */
export async function listOwnedSessions(
  router: RouterClient,
  runners: RunnerPool,
  caller: grpc.Metadata,
): Promise<Map<string, SessionInfo>> {
  const { runners: live } = await router.listRunners({});
  if (live.length === 0) throw unavailable("no runner is registered");
  // Every runner lists what its store holds; a shared store shows a session more than once, and
  // the runner where it is live knows most about it.
  const all = new Map<string, SessionInfo>();
  for (const r of live) {
    let token = "";
    do {
      const page = await runners
        .get(r.address)
        .listStoredSessions({ pageSize: 1000, pageToken: token }, { metadata: caller });
      for (const s of page.sessions) if (!all.has(s.sessionId) || s.running || s.lastSeq > 0) all.set(s.sessionId, s);
      token = page.nextPageToken;
    } while (token !== "");
  }
  return all;
}
