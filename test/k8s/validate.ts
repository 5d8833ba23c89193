// `make lint`'s check of the Kubernetes manifests: renders each overlay with `kubectl kustomize`
// and validates every object offline (schema.ts), failing on unknown fields and wrong types, and
// on a container engine that would listen on TCP (engine-listeners.ts).
//   node dist/test/k8s/validate.js k8s/overlays/dev k8s/overlays/prod k8s/adapters/slack k8s/adapters/telegram
import { execFileSync } from "node:child_process";
import { parseAllDocuments } from "yaml";
import { engineListenerProblems } from "./engine-listeners.js";
import { validateObject } from "./schema.js";

let failed = false;
for (const dir of process.argv.slice(2)) {
  const rendered = execFileSync("kubectl", ["kustomize", dir], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  const docs = parseAllDocuments(rendered)
    .map((d) => d.toJS() as unknown)
    .filter((d) => d);
  const problems = docs.flatMap((d) => [...validateObject(d), ...engineListenerProblems(d)]);
  for (const p of problems) process.stderr.write(`${dir}: ${p}\n`);
  failed ||= problems.length > 0 || docs.length === 0;
  process.stdout.write(`${dir}: ${docs.length} objects, ${problems.length} problems\n`);
}
process.exitCode = failed ? 1 : 0;
