// The manifests' offline validator (test/k8s/schema.ts): what it must refuse, so that `make lint`
// passing means something.
import { test } from "node:test";
import assert from "node:assert/strict";
import { validateObject } from "../k8s/schema.js";

const deployment = (spec: Record<string, unknown>) => ({
  apiVersion: "apps/v1",
  kind: "Deployment",
  metadata: { name: "d", namespace: "n" },
  spec: {
    selector: { matchLabels: { a: "b" } },
    template: {
      metadata: { labels: { a: "b" } },
      spec: {
        containers: [
          {
            name: "c",
            image: "i",
            readinessProbe: { grpc: { port: 50051 } },
            resources: { limits: { memory: "1Gi" } },
          },
        ],
      },
    },
    ...spec,
  },
});

test("a valid Deployment (gRPC probe included) has no problems", () => {
  assert.deepEqual(validateObject(deployment({ replicas: 2 })), []);
});

test("an unknown field is refused, at any depth, with its path", () => {
  assert.deepEqual(validateObject(deployment({ replcas: 2 })), [
    "Deployment n/d.spec.replcas: unknown field (V1DeploymentSpec has no such field)",
  ]);
  const d = deployment({});
  (d.spec.template.spec.containers[0] as Record<string, unknown>).imagePullPolicyy = "Always";
  assert.match(validateObject(d).join(), /spec\.template\.spec\.containers\[0\]\.imagePullPolicyy: unknown field/);
});

test("a wrong type is refused", () => {
  assert.match(validateObject(deployment({ replicas: "two" })).join(), /spec\.replicas: must be a number/);
  const d = deployment({});
  (d.spec.template.spec as Record<string, unknown>).containers = { name: "c" };
  assert.match(validateObject(d).join(), /containers: must be a list/);
});

test("a kind the API does not have is refused", () => {
  assert.match(
    validateObject({ apiVersion: "apps/v1", kind: "Deploymnet", metadata: { name: "x" } }).join(),
    /apps\/v1 Deploymnet is not a kind this Kubernetes version knows/,
  );
  assert.deepEqual(validateObject({ kind: "Service" }), ["an object without apiVersion and kind"]);
});

test("a DinD engine whose command line opens TCP is refused; the manifest's own is not", async () => {
  const { engineListenerProblems, tcpListener } = await import("../k8s/engine-listeners.js");
  const dind = (c: Record<string, unknown>) => ({ name: "engine", image: "docker:27-dind", ...c });
  // What the sandbox manifest had: args alone, so the entrypoint prepends a TCP listener.
  assert.match(tcpListener(dind({ args: ["--host=unix:///run/docker/docker.sock"] })) ?? "", /2376/);
  assert.match(tcpListener(dind({})) ?? "", /2376/);
  assert.match(
    tcpListener(dind({ command: ["dockerd", "-H", "tcp://0.0.0.0:2375"] })) ?? "",
    /tcp:\/\/0\.0\.0\.0:2375/,
  );
  assert.match(tcpListener(dind({ args: ["dockerd", "--host=tcp://127.0.0.1:2375"] })) ?? "", /tcp:/);
  assert.equal(
    tcpListener(dind({ command: ["dockerd-entrypoint.sh", "dockerd", "--host=unix:///run/docker/docker.sock"] })),
    undefined,
  );
  assert.equal(tcpListener({ name: "cli", image: "docker:27-cli", command: ["docker", "load"] }), undefined);
  // Found in init containers of a workload, with where it is.
  const d = deployment({});
  (d.spec.template.spec as Record<string, unknown>).initContainers = [dind({ args: ["--debug"] })];
  assert.match(engineListenerProblems(d).join(), /^Deployment n\/d container engine: dockerd-entrypoint\.sh/);
  // And the rendered manifests pass: make lint runs the same check over them.
  const { readFileSync } = await import("node:fs");
  const { parseAllDocuments } = await import("yaml");
  const file = new URL("../../../k8s/base/sandbox.yaml", import.meta.url);
  const docs = parseAllDocuments(readFileSync(file, "utf8")).map((x) => x.toJS());
  assert.deepEqual(
    docs.flatMap((x) => engineListenerProblems(x)),
    [],
  );
  assert.ok(
    docs.some((x) => JSON.stringify(x).includes("docker:27-dind")),
    "the sandbox manifest runs DinD",
  );
});

test("the folder check refuses a folder over 25 source files, and services/ passes it", async () => {
  const { mkdtempSync, mkdirSync, writeFileSync, rmSync } = await import("node:fs");
  const os = await import("node:os");
  const path = await import("node:path");
  const { overFull } = await import("../lint/folders.js");
  const dir = mkdtempSync(path.join(os.tmpdir(), "troupe-rooms-"));
  try {
    mkdirSync(path.join(dir, "hall"));
    for (let i = 0; i < 26; i++) writeFileSync(path.join(dir, "hall", `f${i}.ts`), "");
    writeFileSync(path.join(dir, "hall", "notes.md"), "");
    assert.deepEqual(overFull(dir), [{ folder: path.join(dir, "hall"), files: 26 }]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  assert.deepEqual(overFull(new URL("../../../services", import.meta.url).pathname), []);
});
