// The snapshot calls of the sandbox service: a session's workspace archived as its tenant's
// (snapshots.ts), listed, deleted, and made another session's workspace. The tenant is the
// caller's (the identity in the call's metadata); the session's workspace is found by the same
// scope key as its commands use, so a session of someone else is one without a workspace.
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { identityOf } from "../../shared/auth/auth.js";
import { failedPrecondition, invalidArgumentIf, notFound } from "../../shared/errors.js";
import type { Snapshot } from "../../shared/gen/troupe/v1/sandbox_pb.js";
import type { grpc } from "../../shared/rpc.js";
import type { SandboxFleet } from "../fleet.js";
import { archiveCap, archiveWorkspace } from "./workspace-archive.js";
import type { WorkspaceSaves } from "./workspace-saves.js";
import { type SnapshotRecord, Snapshots } from "./snapshots.js";
import type { WorkspaceUsage } from "./workspace-usage.js";

type Call = { metadata: grpc.Metadata };
type SessionRequest = { sessionId: string; agentId: string };

export interface SnapshotDeps {
  fleet: SandboxFleet;
  snapshots: Snapshots;
  /** Absent when workspaces are discarded (TROUPE_SANDBOX_WORKSPACES): nothing can be restored. */
  saves?: WorkspaceSaves;
  usage: WorkspaceUsage;
  quotaOf: (tenant: string) => number;
  /** A workspace's size bound (the tmpfs's); an archive of one is at most about twice it. */
  workspaceBytes: number;
  scopeKey: (req: SessionRequest, call: Call) => string;
  requireEngine: () => Promise<void>;
}

const MAX_NAME = 100;

const snapshotOf = (r: SnapshotRecord): Snapshot =>
  ({
    snapshotId: r.id,
    name: r.name,
    sourceSessionId: r.sourceSessionId,
    createTime: timestampFromMs(r.createdAt),
    sizeBytes: BigInt(r.bytes),
  }) as Snapshot;

export function snapshotCalls(d: SnapshotDeps) {
  return {
    async createSnapshot(req: SessionRequest & { name: string }, call: Call) {
      const key = d.scopeKey(req, call);
      invalidArgumentIf([...req.name].length > MAX_NAME, `name must be at most ${MAX_NAME} characters`);
      const { tenant } = identityOf(call.metadata);
      await d.requireEngine();
      // The live workspace when the session has a sandbox; else its last save.
      const live = await d.fleet.find(key);
      const saved = live ? undefined : await d.saves?.archiveOf(key);
      if (!live && !saved) throw notFound(`session ${req.sessionId} has no workspace to snapshot`);
      const write = live
        ? (target: string, max: number) =>
            archiveWorkspace(live.agent, target, Math.min(max, archiveCap(d.workspaceBytes)))
        : Snapshots.copying(saved!.file, saved!.info.bytes);
      const record = await d.snapshots.create(tenant, req.sessionId, req.name, write);
      return { snapshot: snapshotOf(record) };
    },

    async listSnapshots(_req: unknown, call: Call) {
      const { tenant } = identityOf(call.metadata);
      return {
        snapshots: (await d.snapshots.list(tenant)).map(snapshotOf),
        usedBytes: BigInt(d.usage.of(tenant)),
        quotaBytes: BigInt(d.quotaOf(tenant)),
      };
    },

    async deleteSnapshot(req: { snapshotId: string }, call: Call) {
      await d.snapshots.delete(identityOf(call.metadata).tenant, req.snapshotId);
      return {};
    },

    async restoreSnapshot(req: SessionRequest & { snapshotId: string; replace: boolean }, call: Call) {
      const key = d.scopeKey(req, call);
      const { tenant } = identityOf(call.metadata);
      const snapshot = await d.snapshots.get(tenant, req.snapshotId);
      if (!d.saves)
        throw failedPrecondition("workspaces are not kept in this deployment (TROUPE_SANDBOX_WORKSPACES=discarded)");
      await d.requireEngine();
      const has = (await d.fleet.find(key)) !== undefined || (await d.saves.archiveOf(key)) !== undefined;
      if (has && !req.replace)
        throw failedPrecondition(
          `session ${req.sessionId} has a workspace already; set replace to remove it and start from the snapshot`,
        );
      if (has) await d.fleet.release(key);
      const from = `snapshot ${snapshot.id}${snapshot.name ? ` ("${snapshot.name}")` : ""} of ${new Date(snapshot.createdAt).toISOString()}`;
      await d.saves.adopt(key, tenant, await d.snapshots.archiveOf(snapshot), snapshot.bytes, from);
      return {};
    },
  };
}
