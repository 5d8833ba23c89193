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
