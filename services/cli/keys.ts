// `troupe keys`: the gateway's API keys. Only hashes are stored, so `create` is the one time a key
// can be read; a running gateway picks changes up within seconds, and a revoked key's open
// streams end then too.
//   troupe keys create --tenant T --principal P [--role user|adapter|approver|admin] [--channel C]... [--name N]
//   troupe keys ls
//   troupe keys revoke NAME
import { createApiKey, listApiKeys, revokeApiKey, ROLES, type Role } from "../shared/auth/api-keys.js";
import { loadConfig } from "../shared/config/config.js";
import { printTable } from "./table.js";

const USAGE = `usage: troupe keys create --tenant TENANT --principal PRINCIPAL [--role user|adapter|approver|admin] [--channel CHANNEL]... [--name NAME] [--api-keys FILE]
       troupe keys ls [--api-keys FILE]
       troupe keys revoke NAME [--api-keys FILE]
An adapter key (--role adapter) may call Deliver for the channels it names with --channel, and only those.
`;

export async function keysCommand(args: string[]): Promise<number> {
  const [sub, ...rest] = args;
  const cfg = loadConfig(rest, undefined, {
    tenant: { type: "string" },
    principal: { type: "string" },
    name: { type: "string" },
    role: { type: "string" },
    channel: { type: "string", multiple: true },
  });
  const flags = cfg.flags as Record<string, string | string[] | undefined>;
  const fail = (message: string) => {
    process.stderr.write(`troupe keys: ${message}\n${USAGE}`);
    return 2;
  };
  try {
    switch (sub) {
      case "create": {
        const tenant = flags.tenant as string | undefined;
        const principal = flags.principal as string | undefined;
        if (!tenant || !principal) return fail("--tenant and --principal are required");
        const role = (flags.role as string | undefined) ?? "user";
        if (!ROLES.includes(role as Role)) return fail(`--role must be one of ${ROLES.join(", ")}`);
        const id = (flags.name as string | undefined) ?? `${principal}-${new Date().toISOString()}`;
        const key = await createApiKey(cfg.apiKeysFile, {
          tenant,
          principal,
          id,
          role: role as Role,
          channels: (flags.channel as string[] | undefined) ?? [],
        });
        process.stderr.write(
          `added ${id} to ${cfg.apiKeysFile} (only its hash is kept; this is the one time the key is shown):\n`,
        );
        process.stdout.write(`${key}\n`);
        return 0;
      }
      case "ls": {
        const rows = (await listApiKeys(cfg.apiKeysFile)).map((k) => [
          k.id,
          k.tenant,
          k.principal,
          k.role,
          k.channels.join(",") || "-",
          k.createdMs ? new Date(k.createdMs).toISOString() : "-",
        ]);
        const head = ["NAME", "TENANT", "PRINCIPAL", "ROLE", "CHANNELS", "CREATED"];
        printTable(head, rows);
        return 0;
      }
      case "revoke": {
        const [id] = cfg.rest;
        if (!id) return fail("name the key to revoke (troupe keys ls lists them)");
        if (!(await revokeApiKey(cfg.apiKeysFile, id))) {
          process.stderr.write(`troupe keys: no key named ${id} in ${cfg.apiKeysFile}\n`);
          return 1;
        }
        process.stdout.write(`revoked ${id}; gateways refuse it within seconds and end its open streams\n`);
        return 0;
      }
      default:
        return fail(sub ? `unknown subcommand ${sub}` : "a subcommand is required");
    }
  } catch (err) {
    process.stderr.write(`troupe keys: ${(err as Error).message}\n`);
    return 1;
  }
}
