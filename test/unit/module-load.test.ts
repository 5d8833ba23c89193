// What each service loads when its module graph is imported, before anything runs: the packages a
// service may never use (an SDK for a provider nobody configured, the HTTP edge when it is off)
// cost megabytes of resident memory each (bench/history.md, bench/footprint), so they are loaded
// on first use. This guards that no static import brings one back.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";

/** The npm packages a fresh process resolves while importing `entry`. */
function packagesLoadedBy(entry: string): Set<string> {
  const script = `
    import { registerHooks } from "node:module";
    const seen = new Set();
    registerHooks({ resolve(spec, ctx, next) {
      const r = next(spec, ctx);
      const m = /node_modules\\/((?:@[^/]+\\/)?[^/]+)/.exec(r.url);
      if (m) seen.add(m[1]);
      return r;
    } });
    await import(${JSON.stringify(entry)});
    console.log(JSON.stringify([...seen]));
  `;
  const out = execFileSync(process.execPath, ["--input-type=module", "-e", script], { encoding: "utf8" });
  return new Set(JSON.parse(out.trim().split("\n").at(-1)!) as string[]);
}

/** A service's module graph; "up" is the supervisor's (and the one process's of --one-process). */
const entry = (service: string) =>
  fileURLToPath(
    new URL(
      service === "up" ? "../../services/cli/up/command.js" : `../../services/${service}/server.js`,
      import.meta.url,
    ),
  );

/** Per service: packages that must wait for their first use. */
const DEFERRED: Record<string, string[]> = {
  gateway: ["@connectrpc/connect-node", "@connectrpc/connect", "undici", "openai", "pg"],
  router: ["undici", "openai", "pg"],
  runner: ["openai", "croner", "pg", "html-to-text", "gpt-tokenizer", "@modelcontextprotocol/sdk"],
  sandbox: ["undici", "openai", "pg"],
  memory: ["openai", "pg"],
  up: ["pg", "openai", "@connectrpc/connect-node", "undici"],
};

describe("packages deferred to first use", () => {
  for (const [service, deferred] of Object.entries(DEFERRED)) {
    test(`${service}: none of ${deferred.join(", ")} at import`, () => {
      const loaded = packagesLoadedBy(entry(service));
      assert.ok(loaded.has("@grpc/grpc-js"), "the probe sees what is loaded");
      assert.deepEqual(
        deferred.filter((p) => loaded.has(p)),
        [],
      );
    });
  }
});
