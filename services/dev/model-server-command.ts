import { loadConfig } from "../shared/config.js";
import { splitHostPort } from "../shared/host-port.js";
import { createLogger } from "../shared/log.js";
import { startScriptedModelServer } from "./scripted-model/server.js";

export async function modelServerCommand(args: string[]): Promise<void> {
  const cfg = loadConfig(args, undefined, { "token-rate": { type: "string" } });
  const logger = createLogger("model", cfg.logLevel, cfg.logFormat);
  const [host, port] = splitHostPort(cfg.addr.model);
  const tokenRate = Number(cfg.flags["token-rate"] ?? cfg.scriptedTokenRate);
  if (!Number.isFinite(tokenRate) || tokenRate < 0) throw new Error("--token-rate must be a number >= 0");
  const server = await startScriptedModelServer({ host, port, tokenRate });
  logger.info(`scripted model server (OpenAI API) on http://${host}:${server.port}/v1`, { tokenRate });
  const stop = async () => {
    await server.close();
    process.exit(0);
  };
  process.on("SIGTERM", () => void stop());
  process.on("SIGINT", () => void stop());
}
