// `troupe up --one-process`: every service of `troupe up` in this Node process, each still serving
// on its own ports with its own configuration, so clients, the CLI and the other services see no
// difference. For laptops and small VMs: one runtime, one heap, one copy of every module (see
// bench/history.md, footprint). A crash takes every service down at once, and nothing restarts
// it: run it under a supervisor (systemd, a container's restart policy) where that matters.
import { loadConfig } from "../../shared/config/config.js";
import { splitHostPort } from "../../shared/net/host-port.js";
import { runServices, type ServiceUnit } from "../../shared/process/service.js";
import { SERVICES } from "../service-starters.js";
import type { Child } from "./child.js";

export async function runInOneProcess(
  children: Child[],
  env: NodeJS.ProcessEnv,
  cleanup: () => Promise<void>,
): Promise<void> {
  const stops: (() => Promise<void>)[] = [];
  const units: ServiceUnit[] = [];
  for (const child of children) {
    const [kind, ...args] = child.args;
    // Only the first service's --metrics is used: the process has one meter provider.
    const cfg = loadConfig(args, env);
    if (kind === "model-server") {
      const { startScriptedModelServer } = await import("../../dev/scripted-model/server.js");
      const [host, port] = splitHostPort(cfg.addr.model);
      const server = await startScriptedModelServer({ host, port, tokenRate: cfg.scriptedTokenRate });
      stops.push(() => server.close());
      continue;
    }
    units.push({ name: child.name, cfg, start: await SERVICES[kind]() });
  }
  await runServices("all", units, async () => {
    for (const stop of stops) await stop();
    await cleanup();
  });
}
