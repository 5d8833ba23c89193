// `troupe logs [-f] [--service S] [-n N]`: what the services of `troupe up` wrote, from
// <data-dir>/logs/<service>.log. Without --service, every service's last lines merged by time
// (each line starts with its ISO time); -f follows the files as they grow. JSON lines (a stack run
// with TROUPE_LOG_FORMAT=json) are shown as the plain lines a terminal gets.
import { createReadStream, watchFile } from "node:fs";
import { readdir, readFile, stat } from "node:fs/promises";
import path from "node:path";
import readline from "node:readline";
import { loadConfig } from "../shared/config/config.js";
import { textLine } from "../shared/process/log.js";

/** A JSON record as its plain line (time first); any other line as it is. */
function plainLine(line: string): string {
  if (!line.startsWith("{")) return line;
  try {
    return textLine(JSON.parse(line)).trimEnd();
  } catch {
    return line;
  }
}

export async function logsCommand(args: string[]): Promise<number> {
  const cfg = loadConfig(args, undefined, {
    follow: { type: "boolean", short: "f" },
    service: { type: "string" },
    lines: { type: "string", short: "n" },
  });
  const dir = path.join(cfg.dataDir, "logs");
  const lines = Number(cfg.flags.lines ?? 50);
  if (!Number.isInteger(lines) || lines < 0) {
    process.stderr.write(`troupe logs: -n takes a whole number, not "${String(cfg.flags.lines)}"\n`);
    return 2;
  }
  const available = (await readdir(dir).catch(() => [] as string[]))
    .filter((f) => f.endsWith(".log"))
    .map((f) => f.slice(0, -4))
    .sort();
  if (available.length === 0) {
    process.stderr.write(`troupe logs: no logs in ${dir} (troupe up writes them there)\n`);
    return 1;
  }
  const wanted = cfg.flags.service === undefined ? available : [String(cfg.flags.service)];
  for (const s of wanted)
    if (!available.includes(s)) {
      process.stderr.write(`troupe logs: no log for "${s}"; there are: ${available.join(", ")}\n`);
      return 2;
    }
  const files = wanted.map((s) => path.join(dir, `${s}.log`));
  const tails = (await Promise.all(files.map((f) => readFile(f, "utf8")))).flatMap((t) =>
    t.split("\n").filter(Boolean).slice(-lines).map(plainLine),
  );
  // Lines start with their time, so a sort merges the services in order (stable for equal times).
  if (files.length > 1) tails.sort((a, b) => a.slice(0, 24).localeCompare(b.slice(0, 24)));
  if (lines > 0) process.stdout.write(`${tails.slice(-lines).join("\n")}\n`);
  if (!cfg.flags.follow) return 0;

  for (const file of files) {
    let offset = (await stat(file)).size;
    watchFile(file, { interval: 500 }, (now) => {
      // A restart of `troupe up` may start a new file: read it from the beginning.
      if (now.size < offset) offset = 0;
      if (now.size === offset) return;
      const chunk = createReadStream(file, { start: offset, end: now.size - 1, encoding: "utf8" });
      void (async () => {
        for await (const line of readline.createInterface({ input: chunk, crlfDelay: Number.POSITIVE_INFINITY }))
          process.stdout.write(`${plainLine(line)}\n`);
      })();
      offset = now.size;
    });
  }
  await new Promise<void>((resolve) => process.once("SIGINT", () => resolve()));
  return 0;
}
