// `troupe store migrate|status`: the PostgreSQL store's schema (shared/pg.ts). Services migrate at
// start too; this is for operators who upgrade the schema as its own step (a Kubernetes Job
// before a rollout, say) and for checking where a database stands.
import { loadConfig } from "../shared/config/config.js";
import { MIGRATIONS, migrate, openPool, schemaVersion } from "../shared/pg.js";

export async function storeCommand(args: string[]): Promise<number> {
  const [verb, ...rest] = args;
  if (verb !== "migrate" && verb !== "status") {
    process.stderr.write(`troupe store: unknown subcommand "${verb ?? ""}"; use: troupe store migrate | status\n`);
    return 2;
  }
  const cfg = loadConfig(rest);
  if (!cfg.storeUrl) {
    process.stderr.write("troupe store: TROUPE_STORE_URL (or --store-url) must name a postgres:// database\n");
    return 2;
  }
  const pool = openPool(cfg.storeUrl, 1);
  try {
    if (verb === "status") {
      const at = await schemaVersion(pool);
      process.stdout.write(
        `schema version ${at} of ${MIGRATIONS.length}${at < MIGRATIONS.length ? " (migrations due)" : ""}\n`,
      );
      return at > MIGRATIONS.length ? 1 : 0;
    }
    const applied = await migrate(pool);
    process.stdout.write(
      applied.length
        ? `applied migrations ${applied.join(", ")}; schema at version ${MIGRATIONS.length}\n`
        : `schema already at version ${MIGRATIONS.length}\n`,
    );
    return 0;
  } catch (err) {
    process.stderr.write(`troupe store: ${(err as Error).message}\n`);
    return 1;
  } finally {
    await pool.end();
  }
}
