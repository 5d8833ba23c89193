import { readFile } from "node:fs/promises";
import { loadConfig } from "../shared/config/config.js";
import { splitHostPort } from "../shared/net/host-port.js";
import { exitProcess } from "../shared/process/exit.js";
import { createLogger } from "../shared/process/log.js";
import { startScriptedModelServer } from "./scripted-model/server.js";

export async function modelServerCommand(args: string[]): Promise<void> {
  const cfg = loadConfig(args, undefined, {
    "token-rate": { type: "string" },
    "https-cert": { type: "string" },
    "https-key": { type: "string" },
  });
  const logger = createLogger("model", cfg.logLevel, cfg.logFormat);
  const [host, port] = splitHostPort(cfg.addr.model);
  const tokenRate = Number(cfg.flags["token-rate"] ?? cfg.scriptedTokenRate);
  if (!Number.isFinite(tokenRate) || tokenRate < 0) throw new Error("--token-rate must be a number >= 0");
  const [cert, key] = [cfg.flags["https-cert"], cfg.flags["https-key"]];
  if ((cert === undefined) !== (key === undefined)) throw new Error("--https-cert and --https-key go together");
  const read = (flag: string, file: string) =>
    readFile(file).catch((err: Error) => {
      throw new Error(`--${flag}: cannot read ${file} (${err.message})`);
    });
  const tls =
    cert && key
      ? { cert: await read("https-cert", String(cert)), key: await read("https-key", String(key)) }
      : undefined;
  const server = await startScriptedModelServer({ host, port, tokenRate, tls });
  const scheme = tls ? "https" : "http";
  logger.info(`scripted model server (OpenAI API) on ${scheme}://${host}:${server.port}/v1`, { tokenRate });
  const stop = async () => {
    await server.close();
    await exitProcess(0);
  };
  process.on("SIGTERM", () => void stop());
  process.on("SIGINT", () => void stop());
}
