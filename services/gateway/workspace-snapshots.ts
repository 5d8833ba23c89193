// The gateway's snapshot calls: a caller's session's workspace kept as a snapshot of its tenant,
// listed, deleted, and made the workspace of another of its sessions. Each is the sandbox service's
// own call (sandbox/workspaces/snapshot-calls.ts) made as the caller: the sandbox finds a session's
// workspace by the caller's tenant and principal with the session's id, so another's session is
// one without a workspace, and another tenant's snapshot is NOT_FOUND, as a missing one is.
import { identityMetadata, identityOf } from "../shared/auth/auth.js";
import type { GatewayService } from "../shared/gen/troupe/v1/gateway_pb.js";
import type { SandboxService } from "../shared/gen/troupe/v1/sandbox_pb.js";
import type { ServiceClient, ServiceImpl, grpc } from "../shared/rpc.js";

type Call = { metadata: grpc.Metadata };
type Calls = Pick<
  ServiceImpl<(typeof GatewayService)["method"]>,
  "snapshotWorkspace" | "listWorkspaceSnapshots" | "deleteWorkspaceSnapshot" | "restoreWorkspaceSnapshot"
>;

/** A snapshot of a large workspace is a `tar` of up to twice its size: minutes are allowed. */
const SNAPSHOT_TIMEOUT_MS = 180_000;

export function workspaceSnapshotCalls(sandbox: ServiceClient<(typeof SandboxService)["method"]>): Calls {
  const as = (call: Call) => identityMetadata(identityOf(call.metadata));
  return {
    async snapshotWorkspace(req, call) {
      const { snapshot } = await sandbox.createSnapshot(
        { sessionId: req.sessionId, agentId: req.agentId, name: req.name },
        { metadata: as(call), timeoutMs: SNAPSHOT_TIMEOUT_MS },
      );
      return { snapshot };
    },
    async listWorkspaceSnapshots(_req, call) {
      const { snapshots, usedBytes, quotaBytes } = await sandbox.listSnapshots(
        {},
        { metadata: as(call), timeoutMs: 10_000 },
      );
      return { snapshots, usedBytes, quotaBytes };
    },
    async deleteWorkspaceSnapshot(req, call) {
      await sandbox.deleteSnapshot({ snapshotId: req.snapshotId }, { metadata: as(call), timeoutMs: 10_000 });
      return {};
    },
    async restoreWorkspaceSnapshot(req, call) {
      await sandbox.restoreSnapshot(
        { snapshotId: req.snapshotId, sessionId: req.sessionId, agentId: req.agentId, replace: req.replace },
        { metadata: as(call), timeoutMs: 60_000 },
      );
      return {};
    },
  };
}
