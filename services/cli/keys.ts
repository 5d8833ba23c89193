// `troupe keys create --tenant T --principal P [--name N]`: adds an API key to the gateway's keys
// file and prints it. Only its hash is stored, so this is the one time it can be read; a running
// gateway picks the new key up within seconds.
import { createApiKey } from "../shared/auth.js";
import { loadConfig } from "../shared/config.js";

export async function keysCommand(args: string[]): Promise<number> {
  const [sub, ...rest] = args;
  const cfg = loadConfig(rest, process.env, { tenant: { type: "string" }, principal: { type: "string" }, name: { type: "string" } });
  const flags = cfg.flags as Record<string, string | undefined>;
  if (sub !== "create" || !flags.tenant || !flags.principal) {
    process.stderr.write("usage: troupe keys create --tenant TENANT --principal PRINCIPAL [--name NAME] [--api-keys FILE]\n");
    return 2;
  }
  const key = await createApiKey(cfg.apiKeysFile, flags.tenant, flags.principal, flags.name ?? `${flags.principal}-${new Date().toISOString()}`);
  process.stderr.write(`added to ${cfg.apiKeysFile} (only its hash is kept; this is the one time the key is shown):\n`);
  process.stdout.write(key + "\n");
  return 0;
}
