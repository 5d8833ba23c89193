// A PostgreSQL server of our own, from Debian's `postgresql` package: for `troupe up --store
// postgres` (in the data directory, kept between runs) and for the tests (in a temp directory,
// thrown away). It listens on 127.0.0.1 only, on a free port, with trust authentication for
// one role, `troupe`; nothing outside this machine can reach it. Run as root, it runs as the
// `postgres` user (PostgreSQL refuses to run as root).
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, readdirSync } from "node:fs";
import { appendFile, chmod, chown, mkdir, readFile, stat } from "node:fs/promises";
import path from "node:path";
import { pgModule } from "../../shared/pg.js";
import { freePort } from "../free-port.js";

export interface LocalPostgres {
  /** postgres://troupe@127.0.0.1:<port>/troupe */
  url: string;
  port: number;
  pid: number;
  /** A fresh, empty database on this server, by URL. */
  createDatabase(name: string): Promise<string>;
  /** Stops the server (fast shutdown) and waits for it to exit. */
  stop(): Promise<void>;
}

/** The newest installed server's bin directory, or an error that says what to install. */
export function postgresBin(): string {
  const root = "/usr/lib/postgresql";
  const versions = existsSync(root)
    ? readdirSync(root)
        .filter((v) => existsSync(path.join(root, v, "bin", "postgres")))
        .sort((a, b) => Number(b) - Number(a))
    : [];
  if (versions.length === 0)
    throw new Error("PostgreSQL is not installed: `apt-get install postgresql` (Debian's package) provides it");
  return path.join(root, versions[0], "bin");
}

/** Runs a server binary as the user PostgreSQL accepts: ourselves, or `postgres` when we are root. */
function asServerUser(bin: string, args: string[]): [string, string[]] {
  return process.getuid?.() === 0 ? ["runuser", ["-u", "postgres", "--", bin, ...args]] : [bin, args];
}

/**
 * Starts a server whose data lives in `dir` (made with initdb on first use). `port` 0 picks a free
 * one. Resolves once it accepts connections.
 */
export async function startLocalPostgres(dir: string, port = 0): Promise<LocalPostgres> {
  const bin = postgresBin();
  const root = process.getuid?.() === 0;
  await mkdir(dir, { recursive: true, mode: 0o700 });
  if (root) {
    await chown(dir, uidOf("postgres"), gidOf("postgres"));
    // The server's user must pass through the folder that holds its own (traverse only: nothing
    // else there becomes readable).
    const parent = path.dirname(dir);
    const mode = (await stat(parent)).mode;
    if ((mode & 0o001) === 0) await chmod(parent, (mode & 0o7777) | 0o001);
    // Folders above that one are not ours to open: one the server's user cannot pass stops the
    // start here, before initdb, with what to do (initdb itself says only "Permission denied").
    const blocked = firstUnreachable(dir);
    if (blocked) throw new Error(unreachableMessage(dir, blocked));
  }
  if (!existsSync(path.join(dir, "PG_VERSION"))) {
    const [cmd, args] = asServerUser(path.join(bin, "initdb"), [
      "-D",
      dir,
      "-U",
      "troupe",
      "-A",
      "trust",
      "-E",
      "UTF8",
      "--no-locale",
    ]);
    const init = spawnSync(cmd, args, { encoding: "utf8" });
    if (init.status !== 0) throw new Error(`initdb failed: ${init.stderr || init.stdout}`);
    // Only this machine's loopback, and many connections: every runner keeps a pool.
    await appendFile(
      path.join(dir, "postgresql.conf"),
      "\n# troupe\nlisten_addresses = '127.0.0.1'\nmax_connections = 300\nshared_buffers = 64MB\n",
    );
  }
  const chosen = port || (await freePort());
  const [cmd, args] = asServerUser(path.join(bin, "postgres"), ["-D", dir, "-p", String(chosen), "-k", dir]);
  const child: ChildProcess = spawn(cmd, args, { stdio: ["ignore", "ignore", "pipe"], detached: false });
  let stderr = "";
  child.stderr?.on("data", (b: Buffer) => {
    stderr = (stderr + b.toString()).slice(-4000);
  });
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  const url = `postgres://troupe@127.0.0.1:${chosen}/postgres`;
  const deadline = Date.now() + 30_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`postgres exited at start: ${stderr}`);
    const c = new (pgModule().Client)({ connectionString: url });
    c.on("error", () => undefined); // a probe that loses its server just fails
    try {
      await c.connect();
      await c.end();
      break;
    } catch {
      await c.end().catch(() => undefined);
      if (Date.now() > deadline) {
        child.kill("SIGKILL");
        throw new Error(`postgres did not accept connections within 30 s: ${stderr}`);
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  const admin = new (pgModule().Pool)({ connectionString: url, max: 1 });
  admin.on("error", () => undefined); // an idle admin connection cut at shutdown is of no interest
  const ensure = async (name: string) => {
    if (!/^[a-z_][a-z0-9_]{0,62}$/.test(name)) throw new Error(`not a database name: ${name}`);
    const { rowCount } = await admin.query("SELECT 1 FROM pg_database WHERE datname = $1", [name]);
    if (!rowCount) await admin.query(`CREATE DATABASE ${name}`);
    return `postgres://troupe@127.0.0.1:${chosen}/${name}`;
  };
  const main = await ensure("troupe");
  return {
    url: main,
    port: chosen,
    pid: child.pid!,
    createDatabase: ensure,
    async stop() {
      await admin.end().catch(() => undefined);
      if (child.exitCode === null) {
        // SIGINT is PostgreSQL's fast shutdown, sent to the postmaster itself (not runuser).
        const postmaster = Number(
          (await readFile(path.join(dir, "postmaster.pid"), "utf8").catch(() => "")).split("\n")[0],
        );
        if (postmaster > 0) process.kill(postmaster, "SIGINT");
        else child.kill("SIGINT");
        const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
        await exited;
        clearTimeout(timer);
      }
    },
  };
}

function idOf(flag: "-u" | "-g", user: string): number {
  const out = spawnSync("id", [flag, user], { encoding: "utf8" });
  if (out.status !== 0) throw new Error(`there is no ${user} user; Debian's postgresql package makes it`);
  return Number(out.stdout.trim());
}
const uidOf = (u: string) => idOf("-u", u);
const gidOf = (u: string) => idOf("-g", u);

/** The first folder on the way to `dir` that the postgres user cannot enter, or undefined. */
function firstUnreachable(dir: string): string | undefined {
  const ways: string[] = [];
  for (let d = path.resolve(dir); ; d = path.dirname(d)) {
    ways.unshift(d);
    if (d === path.dirname(d)) break;
  }
  const probe = spawnSync(
    "runuser",
    ["-u", "postgres", "--", "sh", "-c", 'for d; do [ -x "$d" ] || { printf %s "$d"; exit 1; }; done', "sh", ...ways],
    { encoding: "utf8" },
  );
  return probe.status === 0 ? undefined : probe.stdout || ways[0];
}

function unreachableMessage(dir: string, blocked: string): string {
  return (
    `the PostgreSQL server runs as the postgres user, which cannot enter ${blocked}, so it cannot reach its data directory ${dir}. ` +
    `Either keep Troupe's data where that user can pass (--data-dir /var/lib/troupe, say), ` +
    `or let it pass through ${blocked} without reading it: \`setfacl -m u:postgres:x ${blocked}\` (that user only) or \`chmod o+x ${blocked}\` (every user; nothing there becomes listable); ` +
    `or use a server of your own with TROUPE_STORE_URL`
  );
}
