// The gateway's AdminService: the operator's view of sandboxes and the audit log, for admin keys
// only, over gRPC and over the HTTP face (Connect JSON). Two tenants use the stack; an admin sees
// both, filters by either, and every other key is refused before anything is read.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { AdminService } from "../services/shared/gen/troupe/v1/admin_pb.js";
import { Status } from "../services/shared/errors.js";
import { Role } from "../services/shared/gen/troupe/v1/session_pb.js";
import { createClient } from "../services/shared/rpc.js";
import { startStack, type Stack } from "./helpers/stack.js";

let stack: Stack;
let adminKey = "";

before(async () => {
  stack = await startStack({ env: { TROUPE_SANDBOX_POOL: "0", TROUPE_MEMORY_LEARN: "0" } });
  adminKey = await stack.keyFor("ops", "root", { role: "admin" });
});
after(async () => {
  await stack?.stop();
});

const adminAs = (key: string) =>
  createClient(AdminService, stack.addr.gateway, { headers: { authorization: `Bearer ${key}` } });

async function postJson(method: string, body: unknown, key: string) {
  const res = await fetch(`http://${stack.addr.http}/troupe.v1.AdminService/${method}`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify(body),
  });
  return { status: res.status, json: (await res.json()) as Record<string, unknown> };
}

describe("the operator's view", () => {
  let devSession = "";
  let acmeSession = "";

  before(async () => {
    // The development tenant runs a command (its sandbox) and aborts; a second tenant aborts too.
    const created = await stack.gateway.createSession({});
    devSession = created.session!.sessionId;
    await stack.gateway.sendMessage({ sessionId: devSession, frameId: "p1", text: "$ echo admin-view" });
    for (let i = 0; ; i++) {
      const { messages } = await stack.gateway.getHistory({ sessionId: devSession });
      if (messages.some((m) => m.role === Role.TOOL)) break;
      assert.ok(i < 300, "the command ran within 30 s");
      await new Promise((r) => setTimeout(r, 100));
    }
    await stack.gateway.abort({ sessionId: devSession, frameId: "a1", reason: "dev stops it" });
    const acme = await stack.gatewayAs("acme", "alice");
    acmeSession = (await acme.createSession({})).session!.sessionId;
    await acme.abort({ sessionId: acmeSession, frameId: "a2", reason: "acme stops it" });
    acme.close();
  });

  test("an admin key lists every tenant's audit records, newest first, and filters them", async () => {
    const admin = adminAs(adminKey);
    try {
      let entries = (await admin.listAuditRecords({})).entries;
      for (let i = 0; i < 50 && entries.length < 2; i++) {
        await new Promise((r) => setTimeout(r, 100));
        entries = (await admin.listAuditRecords({})).entries;
      }
      const mine = entries.filter((e) => [devSession, acmeSession].includes(e.sessionId));
      assert.deepEqual(
        mine.map((e) => [e.action, e.tenant, e.sessionId, e.record?.reason]),
        [
          ["abort", "acme", acmeSession, "acme stops it"],
          ["abort", "local", devSession, "dev stops it"],
        ],
      );
      assert.ok(mine.every((e) => e.runnerId !== "" && e.time !== undefined));
      const acmeOnly = (await admin.listAuditRecords({ tenant: "acme" })).entries;
      assert.deepEqual(
        acmeOnly.map((e) => e.tenant),
        acmeOnly.map(() => "acme"),
      );
      assert.ok(acmeOnly.some((e) => e.sessionId === acmeSession));
      const one = (await admin.listAuditRecords({ sessionId: devSession, limit: 1 })).entries;
      assert.deepEqual(
        one.map((e) => e.record?.frameId),
        ["a1"],
      );
      await assert.rejects(admin.listAuditRecords({ limit: 1001 }), { code: Status.INVALID_ARGUMENT });
    } finally {
      admin.close();
    }
  });

  test("an admin key lists the sandboxes, the development tenant's among them", async () => {
    const admin = adminAs(adminKey);
    try {
      const { sandboxes } = await admin.listAllSandboxes({});
      const dev = sandboxes.filter((s) => s.scopeKey.startsWith("session:local.dev."));
      assert.equal(dev.length, 1, JSON.stringify(sandboxes.map((s) => s.scopeKey)));
      assert.equal(dev[0].state, "running");
      assert.ok(dev[0].containerId !== "" && dev[0].runtime !== "");
    } finally {
      admin.close();
    }
  });

  test("user and adapter keys are refused, and nothing is read for them", async () => {
    const userKey = await stack.keyFor("acme", "mallory");
    const adapterKey = await stack.keyFor("acme", "bot", { role: "adapter", channels: ["telegram"] });
    for (const key of [userKey, adapterKey, stack.apiKey]) {
      const c = adminAs(key);
      try {
        await assert.rejects(c.listAuditRecords({}), { code: Status.PERMISSION_DENIED });
        await assert.rejects(c.listAllSandboxes({}), { code: Status.PERMISSION_DENIED });
      } finally {
        c.close();
      }
    }
    const none = adminAs("trp_not-a-key");
    await assert.rejects(none.listAuditRecords({}), { code: Status.UNAUTHENTICATED });
    none.close();
  });

  test("over HTTP: the same calls as JSON, the same refusals as Connect's codes", async () => {
    const ok = await postJson("ListAuditRecords", { tenant: "acme", limit: 5 }, adminKey);
    assert.equal(ok.status, 200, JSON.stringify(ok.json));
    const entries = ok.json.entries as { action: string; record: { reason: string; tenant: string } }[];
    assert.ok(entries.some((e) => e.action === "abort" && e.record.reason === "acme stops it"));
    // The record is a JSON object, not a string to parse again.
    assert.equal(typeof entries[0].record, "object");
    const boxes = await postJson("ListAllSandboxes", {}, adminKey);
    assert.equal(boxes.status, 200);
    assert.ok((boxes.json.sandboxes as unknown[]).length >= 1);

    const refused = await postJson("ListAuditRecords", {}, stack.apiKey);
    assert.equal(refused.status, 403);
    assert.equal(refused.json.code, "permission_denied");
    assert.match(String(refused.json.message), /admin key/);
    const bad = await postJson("ListAuditRecords", { limit: 5000 }, adminKey);
    assert.equal(bad.status, 400);
    assert.equal(bad.json.code, "invalid_argument");
  });
});
