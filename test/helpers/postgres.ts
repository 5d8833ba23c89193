// One throwaway PostgreSQL server per test file (Debian's package, in a temp directory, on a free
// port; services/cli/up/local-postgres.ts), and a fresh database per test on it.
import { chmod, mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after } from "node:test";
import { startLocalPostgres, type LocalPostgres } from "../../services/cli/up/local-postgres.js";

let server: Promise<LocalPostgres> | undefined;
let dir: string | undefined;
let counter = 0;

// Registered at import, so on the file's root: the server outlives every suite of the file.
after(async () => {
  const pg = await server?.catch(() => undefined);
  await pg?.stop();
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** The server of this test file, started on first use and stopped when the file's tests end. */
export function testPostgres(): Promise<LocalPostgres> {
  if (!server) {
    server = (async () => {
      dir = await mkdtemp(path.join(os.tmpdir(), "troupe-pg-"));
      await chmod(dir, 0o711); // the server's user (postgres, when we are root) must reach data/ inside
      return startLocalPostgres(path.join(dir, "data"));
    })();
  }
  return server;
}

/** A URL to a new, empty database (its own schema, its own rows) on the test server. */
export async function freshDatabase(): Promise<string> {
  return (await testPostgres()).createDatabase(`t${process.pid}_${++counter}`);
}
