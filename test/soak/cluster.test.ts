// The cluster soak: the soak's traffic (soak-traffic.ts) through 2 gateways and 2 routers to 3
// runners sharing a PostgreSQL store, while runners are SIGKILLed (and started again) and
// SIGSTOPped (and continued after their lease lapsed) in turn. Nothing acknowledged may be lost,
// reordered or run twice: the sessions of a dead or paused runner move to the others, and a
// paused runner that wakes finds its writes refused by the database.
import { after, before, test } from "node:test";
import pg from "pg";
import { LOAD_QUOTAS, startStack, type Stack } from "../helpers/stack.js";
import { GatewayService } from "../../services/shared/gen/troupe/v1/gateway_pb.js";
import { createClient } from "../../services/shared/rpc.js";
import { testPostgres } from "../helpers/postgres.js";
import { SOAK_ENV, runSoak } from "./soak-traffic.js";

const SESSIONS = Number(process.env.CLUSTER_SESSIONS ?? 300);
const DISRUPTIONS = Number(process.env.CLUSTER_DISRUPTIONS ?? 4);
/** A runner silent this long is dead: short, so the soak's sessions move within seconds. */
const LIVENESS_MS = 2000;

let stack: Stack;
let storeUrl: string;
const runners: { key: string; id: string; addr: string }[] = [];
const gateways: ReturnType<typeof createClient<(typeof GatewayService)["method"]>>[] = [];

before(async () => {
  storeUrl = await (await testPostgres()).createDatabase("cluster");
  stack = await startStack({
    env: { ...SOAK_ENV, ...LOAD_QUOTAS, TROUPE_STORE_URL: storeUrl, TROUPE_RUNNER_LIVENESS_MS: String(LIVENESS_MS) },
  });
  runners.push({ key: "runner", id: "", addr: stack.addr.runner });
  for (const id of ["runner-2", "runner-3"])
    runners.push({ key: id, id, addr: await stack.startInstance(id, "runner", { args: ["--runner-id", id] }) });
  const router2 = await stack.startInstance("router-2", "router");
  const gateway2 = await stack.startInstance("gateway-2", "gateway", { args: ["--router", router2] });
  gateways.push(
    stack.gateway,
    createClient(GatewayService, gateway2, { headers: { authorization: `Bearer ${stack.apiKey}` } }),
  );
});
after(async () => {
  for (const g of gateways.slice(1)) g.close();
  await stack?.stop();
});

/** Starts a runner again under its own id and address, as a supervisor would. */
const restart = async (r: (typeof runners)[number]) => {
  if (r.key === "runner") await stack.start("runner");
  else await stack.startInstance(r.key, "runner", { addr: r.addr, args: ["--runner-id", r.id] });
};

test(`cluster soak: ${SESSIONS} sessions over 2 gateways, 2 routers and 3 runners on PostgreSQL, runners killed and paused in turn`, {
  timeout: 600_000,
}, async () => {
  await runSoak({
    sessions: SESSIONS,
    gateways,
    disruptions: DISRUPTIONS,
    async disrupt(k) {
      const r = runners[k % runners.length];
      if (k % 2 === 0) {
        await stack.kill(r.key, "SIGKILL");
        await restart(r);
        return `killed ${r.key} and started it again`;
      }
      const proc = stack.process(r.key)!;
      proc.kill("SIGSTOP");
      await new Promise((res) => setTimeout(res, LIVENESS_MS * 2));
      proc.kill("SIGCONT");
      return `paused ${r.key} past its lease, then continued it`;
    },
    async rawLog(sessionId) {
      const client = new pg.Client({ connectionString: storeUrl });
      await client.connect();
      try {
        const { rows } = await client.query<{ epoch: number; record: string }>(
          "SELECT r.epoch, r.record FROM troupe_records r JOIN troupe_sessions USING (sid) WHERE session_id = $1 ORDER BY pos",
          [sessionId],
        );
        return rows.map((r) => `{"e":${r.epoch},${r.record.slice(1)}`).join("\n");
      } finally {
        await client.end();
      }
    },
    logs: () => stack.logs(),
  });
});
