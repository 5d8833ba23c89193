// An example Troupe plugin: load it with TROUPE_HOOKS=examples/hooks/guard.mjs (several plugins:
// comma-separated paths). A plugin exports register(api); see docs/turn-pipeline.md for the hooks,
// their order and what each may return.
import { appendFileSync } from "node:fs";

export function register(api) {
  // Refuse shell commands that delete recursively; the model sees the reason and can choose
  // another way. A guard that takes longer than its timeout blocks the call (fail closed).
  api.on(
    "before_tool_call",
    ({ toolName, args }) => {
      if (toolName === "exec" && /\brm\s+-[a-z]*r/i.test(String(args.command))) {
        return { block: true, reason: "recursive deletes are not allowed in this deployment" };
      }
      return undefined;
    },
    { priority: 100, timeoutMs: 2000, name: "no-recursive-rm" },
  );

  // Keep secrets that a command printed out of what the model sees.
  api.on("after_tool_call", ({ result }) => {
    const redacted = result.output.replace(/\b(sk|ghp|xox[bp])-[A-Za-z0-9_-]{10,}/g, "[redacted]");
    return redacted === result.output ? undefined : { output: redacted };
  });

  // An observing hook: a line per finished run. It never delays the run.
  api.on("agent_end", ({ sessionId, stopReason }) => {
    appendFileSync(
      process.env.TROUPE_RUN_TRAIL ?? "/tmp/troupe-runs.log",
      `${new Date().toISOString()} ${sessionId} ${stopReason}\n`,
    );
  });

  // A threat check on every inbound message, after the built-in injection scanner. "high" blocks.
  api.threatCheck("no-credentials-in-chat", (text) =>
    /-----BEGIN (RSA |EC |OPENSSH )?PRIVATE KEY-----/.test(text)
      ? { level: "high", reason: "the message carries a private key; it was not passed to the agent" }
      : { level: "none" },
  );
}
