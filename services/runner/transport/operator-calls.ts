// The runner's side of the gateway's AdminService: its audit log, and the sandboxes of the
// sandbox service it uses. The gateway has checked the caller's admin role; these answer any
// internal caller.
import { create, type JsonObject } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { invalidArgumentIf } from "../../shared/errors.js";
import { AuditEntrySchema } from "../../shared/gen/troupe/v1/admin_pb.js";
import type { ReadAuditLogRequest, RunnerService } from "../../shared/gen/troupe/v1/runner_pb.js";
import type { SandboxService } from "../../shared/gen/troupe/v1/sandbox_pb.js";
import type { ServiceClient, ServiceImpl } from "../../shared/rpc.js";
import type { AuditSink } from "../store/audit-log.js";

type RunnerImpl = ServiceImpl<(typeof RunnerService)["method"]>;

export function operatorCalls(
  audit: AuditSink,
  sandbox: ServiceClient<(typeof SandboxService)["method"]>,
  runnerId: string,
): Pick<RunnerImpl, "readAuditLog" | "describeSandboxes"> {
  return {
    async readAuditLog(req: ReadAuditLogRequest) {
      invalidArgumentIf(req.limit < 1 || req.limit > 1000, "limit must be between 1 and 1000");
      const read = await audit.read({ limit: req.limit, tenant: req.tenant, sessionId: req.sessionId });
      const entries = read.map((a) =>
        create(AuditEntrySchema, {
          time: timestampFromMs(a.timeMs),
          action: a.record.action,
          tenant: a.record.tenant,
          sessionId: a.record.sessionId,
          runnerId: a.runnerId ?? runnerId,
          record: a.record as unknown as JsonObject,
        }),
      );
      return { entries, shared: audit.shared };
    },

    async describeSandboxes() {
      return { sandboxes: (await sandbox.listSandboxes({}, { timeoutMs: 10_000 })).sandboxes };
    },
  };
}
