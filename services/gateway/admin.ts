// The gateway's AdminService (admin.proto): the operator's view, put together from every live
// runner. A runner on the file store keeps its own audit log, so each is asked and the answers
// merged newest first; on PostgreSQL every runner reads the one table, so one answer is all of it.
// Sandboxes come from the sandbox service(s) the runners use, each container listed once.
import { timestampMs } from "@bufbuild/protobuf/wkt";
import { callerOf } from "../shared/auth/auth.js";
import { invalidArgumentIf, permissionDenied, unavailable } from "../shared/errors.js";
import type { AdminService, AuditEntry } from "../shared/gen/troupe/v1/admin_pb.js";
import type { RouterService } from "../shared/gen/troupe/v1/router_pb.js";
import type { SandboxInfo } from "../shared/gen/troupe/v1/sandbox_pb.js";
import type { grpc, ServiceClient, ServiceImpl } from "../shared/rpc.js";
import type { RunnerPool } from "./placement.js";

type RouterClient = ServiceClient<(typeof RouterService)["method"]>;

const DEFAULT_LIMIT = 100;
const MAX_LIMIT = 1000;

/** Admin keys only; every other role is refused before anything is read. */
function requireAdmin(call: { metadata: grpc.Metadata }): void {
  const caller = callerOf(call.metadata);
  if (caller.role !== "admin")
    throw permissionDenied(
      `this call needs an admin key (troupe keys create --role admin); this key's role is ${caller.role}`,
    );
}

export function adminService(router: RouterClient, runners: RunnerPool): ServiceImpl<(typeof AdminService)["method"]> {
  const liveRunners = async () => {
    const { runners: live } = await router.listRunners({});
    if (live.length === 0) throw unavailable("no runner is registered");
    return live.map((r) => runners.get(r.address));
  };

  return {
    async listAllSandboxes(_req, call) {
      requireAdmin(call);
      const byContainer = new Map<string, SandboxInfo>();
      for (const runner of await liveRunners())
        for (const s of (await runner.describeSandboxes({})).sandboxes) byContainer.set(s.containerId, s);
      return { sandboxes: [...byContainer.values()].sort((a, b) => a.name.localeCompare(b.name)) };
    },

    async listAuditRecords(req, call) {
      requireAdmin(call);
      invalidArgumentIf(req.limit > MAX_LIMIT, `limit must be at most ${MAX_LIMIT}`);
      const query = { limit: req.limit || DEFAULT_LIMIT, tenant: req.tenant, sessionId: req.sessionId };
      const entries: AuditEntry[] = [];
      for (const runner of await liveRunners()) {
        const read = await runner.readAuditLog(query);
        entries.push(...read.entries);
        if (read.shared) break;
      }
      const at = (e: AuditEntry) => (e.time ? timestampMs(e.time) : 0);
      return { entries: entries.sort((a, b) => at(b) - at(a)).slice(0, query.limit) };
    },
  };
}
