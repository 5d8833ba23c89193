// `troupe pairing ls | approve CODE | reject CODE | revoke SENDER [--adapter KIND]`: the operator's
// side of the pairing DM policy (adapter/dm-gate.ts). It reads the adapters' pairing books in the
// data directory (DATA_DIR/adapters/<kind>.pairing.json, or beside TROUPE_ADAPTER_STATE) and never
// writes them: a decision is a request file the adapter carries out within a second
// (adapter/pairing-book.ts). approve and reject wait for that, up to 10 s, and say what happened.
import { existsSync } from "node:fs";
import { mkdir, readdir, writeFile } from "node:fs/promises";
import path from "node:path";
import { loadConfig } from "../shared/config/config.js";
import {
  CODE,
  CODE_TTL_MS,
  pairingFiles,
  readBook,
  requestFileName,
  type PairingRequest,
} from "../adapter/pairing-book.js";

const USAGE = "usage: troupe pairing ls | approve CODE | reject CODE | revoke SENDER_ID [--adapter KIND]";
const WAIT_MS = 10_000;

interface Adapter {
  kind: string;
  stateFile: string;
}

/** The adapters with a pairing book: each <kind>.json state in DATA_DIR/adapters, and TROUPE_ADAPTER_STATE. */
async function adapters(dataDir: string, stateFile: string): Promise<Adapter[]> {
  const dir = path.join(dataDir, "adapters");
  const found = (await readdir(dir).catch(() => [] as string[]))
    .filter((n) => n.endsWith(".pairing.json"))
    .map((n) => ({
      kind: n.slice(0, -".pairing.json".length),
      stateFile: path.join(dir, `${n.slice(0, -".pairing.json".length)}.json`),
    }));
  if (stateFile && existsSync(pairingFiles(stateFile).book) && !found.some((a) => a.stateFile === stateFile))
    found.push({ kind: path.basename(stateFile, ".json"), stateFile });
  return found;
}

export async function pairingCommand(args: string[]): Promise<number> {
  const cfg = loadConfig(args.slice(1), undefined, { adapter: { type: "string" } });
  const [verb, arg] = [args[0], cfg.rest[0]];
  const only = cfg.flags.adapter as string | undefined;
  const all = (await adapters(cfg.dataDir, cfg.adapter.stateFile)).filter((a) => !only || a.kind === only);
  const now = Date.now();
  if (verb === "ls" && arg === undefined) {
    if (all.length === 0) {
      process.stdout.write(
        `no adapter in ${cfg.dataDir} keeps a pairing book (TROUPE_ADAPTER_DM_POLICY=pairing makes one)\n`,
      );
      return 0;
    }
    for (const a of all) {
      const book = await readBook(pairingFiles(a.stateFile).book);
      const pending = book.pending.filter((p) => now - p.createdMs < CODE_TTL_MS);
      process.stdout.write(`${a.kind}: ${pending.length} waiting, ${book.allowed.length} let in\n`);
      for (const p of pending)
        process.stdout.write(
          `  ${p.code}  ${p.senderId} (${p.name})  asked ${Math.round((now - p.createdMs) / 60_000)} min ago\n`,
        );
      for (const s of book.allowed)
        process.stdout.write(`  let in  ${s.senderId} (${s.name})  since ${new Date(s.approvedMs).toISOString()}\n`);
    }
    return 0;
  }
  if ((verb === "approve" || verb === "reject") && arg !== undefined) {
    const code = arg.toUpperCase();
    if (!CODE.test(code)) return fail(`${arg} is not a pairing code (8 letters and digits, as the bot sent it)`);
    for (const a of all) {
      const files = pairingFiles(a.stateFile);
      const waiting = (await readBook(files.book)).pending.find(
        (p) => p.code === code && now - p.createdMs < CODE_TTL_MS,
      );
      if (!waiting) continue;
      await request(files.requests, { verb, code });
      const done = await until(async () => !(await readBook(files.book)).pending.some((p) => p.code === code));
      const who = `${waiting.senderId} (${waiting.name})`;
      process.stdout.write(
        done
          ? `${a.kind}: ${verb === "approve" ? `let in ${who}; they were told` : `refused ${who}`}\n`
          : `${a.kind}: ${verb} of ${who} is waiting for the adapter to run; it is carried out when it starts\n`,
      );
      return 0;
    }
    return fail(
      `no stranger waits with code ${code}${only ? ` at the ${only} adapter` : ""} (codes are good for an hour)`,
    );
  }
  if (verb === "revoke" && arg !== undefined) {
    for (const a of all) {
      const files = pairingFiles(a.stateFile);
      if (!(await readBook(files.book)).allowed.some((s) => s.senderId === arg)) continue;
      await request(files.requests, { verb, senderId: arg });
      const done = await until(async () => !(await readBook(files.book)).allowed.some((s) => s.senderId === arg));
      process.stdout.write(
        `${a.kind}: ${arg} ${done ? "may no longer write in private" : "is revoked when the adapter runs"}\n`,
      );
      return 0;
    }
    return fail(`no adapter has let in ${arg}`);
  }
  process.stderr.write(`${USAGE}\n`);
  return 2;
}

async function request(dir: string, r: PairingRequest): Promise<void> {
  await mkdir(dir, { recursive: true, mode: 0o700 });
  await writeFile(path.join(dir, requestFileName(r)), `${new Date().toISOString()}\n`, { mode: 0o600 });
}

async function until(done: () => Promise<boolean>): Promise<boolean> {
  for (const deadline = Date.now() + WAIT_MS; Date.now() < deadline; ) {
    if (await done()) return true;
    await new Promise((r) => setTimeout(r, 200));
  }
  return done();
}

function fail(line: string): number {
  process.stderr.write(`troupe pairing: ${line}\n`);
  return 1;
}
