// `make lint`'s check that every folder under services/ stays a room a newcomer can take in: at
// most 25 source files directly in it (generated code aside). A folder over it wants rooms of
// its own, by concern.
//   node dist/test/lint/folders.js services
import { readdirSync } from "node:fs";
import path from "node:path";

export const MAX_FILES = 25;

/** Each folder below `root` (itself included) holding more than `max` source files directly. */
export function overFull(root: string, max = MAX_FILES): { folder: string; files: number }[] {
  const out: { folder: string; files: number }[] = [];
  const walk = (dir: string) => {
    const entries = readdirSync(dir, { withFileTypes: true });
    const files = entries.filter(
      (e) => e.isFile() && /\.(ts|mts|cts|js|mjs)$/.test(e.name) && !e.name.endsWith(".d.ts"),
    );
    if (files.length > max) out.push({ folder: dir, files: files.length });
    for (const e of entries)
      if (e.isDirectory() && e.name !== "gen" && e.name !== "node_modules") walk(path.join(dir, e.name));
  };
  walk(root);
  return out;
}

if (process.argv[1]?.endsWith("folders.js")) {
  let failed = false;
  for (const root of process.argv.slice(2)) {
    for (const { folder, files } of overFull(root)) {
      process.stderr.write(
        `${folder}: ${files} source files directly (at most ${MAX_FILES}): give it rooms by concern\n`,
      );
      failed = true;
    }
  }
  process.stdout.write(
    failed ? "" : `every folder of ${process.argv.slice(2).join(", ")} holds at most ${MAX_FILES} source files\n`,
  );
  process.exitCode = failed ? 1 : 0;
}
