// Putting agents' workspace templates to the sandbox service when it does not answer: a real
// gRPC client aimed at a port nothing listens on, so every put fails as it would with the
// sandbox service down.
import { test } from "node:test";
import assert from "node:assert/strict";
import { SandboxService } from "../../services/shared/gen/troupe/v1/sandbox_pb.js";
import { createClient } from "../../services/shared/rpc.js";
import { freePort } from "../../services/cli/free-port.js";
import { parseAgentConfig } from "../../services/runner/agent-config.js";
import { WorkspaceTemplates } from "../../services/runner/tools/workspace-templates.js";
import { quietLogger } from "../helpers/in-process.js";

test("with no sandbox service, an agent without a template is not put again on every run; one with a template is", async () => {
  const sandbox = createClient(SandboxService, `127.0.0.1:${await freePort()}`);
  const failures: string[] = [];
  const logger = {
    ...quietLogger,
    error: (_m: string, f?: Record<string, unknown>) => void failures.push(String(f?.agent)),
  };
  const templates = new WorkspaceTemplates(sandbox, logger, 1 << 20);
  try {
    const plain = parseAgentConfig("plain", {});
    const withImage = parseAgentConfig("imaged", { workspace: { image: "troupe-sandbox:busybox" } });
    // Each call is a run starting. The empty put (housekeeping) is not awaited by the run.
    for (let run = 0; run < 3; run++) {
      templates.ensure("plain", plain, "/nonexistent");
      await new Promise((r) => setTimeout(r, 300));
    }
    assert.deepEqual(failures, ["plain"], "one failed put, not one a run");
    // A template the sandboxes must start from: every run waits for it and tries again.
    for (let run = 0; run < 2; run++) await templates.ensure("imaged", withImage, "/nonexistent");
    assert.deepEqual(failures, ["plain", "imaged", "imaged"]);
  } finally {
    sandbox.close();
  }
});
