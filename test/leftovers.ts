// Run by `make test` after the end-to-end tier: every sandbox container made since `--since` (ms)
// must be gone, since each test stops what it started. Any left is named (its scope and stack
// instance say which test made it), removed, and fails the run.
//
//   node dist/test/leftovers.js --since <epoch ms>
import { execFile } from "node:child_process";
import { parseArgs, promisify } from "node:util";

const run = promisify(execFile);
const { values } = parseArgs({ options: { since: { type: "string" } } });

/** The exit status: 0 when none is left, 1 when some were (now removed), 2 for a bad call. */
async function leftovers(): Promise<number> {
  const since = Number(values.since);
  if (!Number.isFinite(since)) {
    console.error("usage: leftovers --since <epoch ms>");
    return 2;
  }
  const { stdout } = await run("docker", [
    "ps",
    "-a",
    "--filter",
    "label=troupe.owner=troupe-sandbox",
    "--format",
    '{{.ID}}\t{{.Label "troupe.created"}}\t{{.Label "troupe.scope"}}\t{{.Label "troupe.instance"}}\t{{.CreatedAt}}',
  ]);
  const left = stdout
    .split("\n")
    .filter(Boolean)
    .map((line) => line.split("\t"))
    .filter(([, created]) => Number(created) >= since);
  if (left.length === 0) {
    console.log("leftovers: no sandbox container outlived its test");
    return 0;
  }
  console.error(`leftovers: ${left.length} sandbox container(s) outlived their tests:`);
  for (const [id, , scope, instance, at] of left)
    console.error(`  ${id} scope=${scope} instance=${instance} made ${at}`);
  await run("docker", ["rm", "-f", ...left.map(([id]) => id)]);
  return 1;
}

// A natural exit: process.exit() can hang at its end in Node 24 (services/shared/process/exit.ts).
process.exitCode = await leftovers();
