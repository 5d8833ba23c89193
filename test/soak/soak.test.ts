// Soak: many sessions with random prompts, steers, follow-ups, collects, interrupts and aborts,
// while the runner is killed (SIGKILL) three times (soak-traffic.ts has the clients and checks).
import { readFile } from "node:fs/promises";
import { after, before, test } from "node:test";
import { sessionLogPath } from "../../services/runner/store/jsonl-session-store.js";
import { DEV_IDENTITY } from "../../services/shared/auth/auth.js";
import { refOf } from "../../services/shared/session-ref.js";
import { startStack, type Stack } from "../helpers/stack.js";
import { SOAK_ENV, runSoak } from "./soak-traffic.js";

const SESSIONS = Number(process.env.SOAK_SESSIONS ?? 500);
const KILLS = Number(process.env.SOAK_KILLS ?? 3);

let stack: Stack;
before(async () => {
  stack = await startStack({
    env: SOAK_ENV,
    ...(process.env.SOAK_DATA_DIR ? { dataDir: process.env.SOAK_DATA_DIR } : {}),
  });
});
after(async () => {
  await stack?.stop();
});

test(`soak: ${SESSIONS} sessions, random traffic, the runner killed ${KILLS} times; nothing acknowledged is lost, reordered or run twice`, {
  timeout: 600_000,
}, async () => {
  await runSoak({
    sessions: SESSIONS,
    gateways: [stack.gateway],
    disruptions: KILLS,
    async disrupt() {
      await stack.kill("runner", "SIGKILL");
      await stack.start("runner");
      return "killed the runner and started it again";
    },
    rawLog: (id) => readFile(sessionLogPath(stack.dataDir, refOf(DEV_IDENTITY, id)), "utf8").catch(() => ""),
    logs: () => stack.logs(),
  });
});
