// Who may call what. Two kinds of caller, two checks, both run by a server interceptor before any
// handler (rpc.ts):
//
// - Clients, at the gateway: `authorization: Bearer <API key>`. Keys are stored as SHA-256 hashes,
//   each mapped to a tenant and a principal; the key itself is shown once, when it is made. The
//   gateway strips whatever identity headers a client sent and sets the verified ones.
// - Troupe's own services, everywhere else: `troupe-internal-token: <shared secret>`. A client
//   that reaches the runner, memory or sandbox directly has no token and is refused. The gateway
//   passes the client's verified identity to the runner in the identity headers, which the runner
//   believes because the call carries the internal token.
//
// The health service answers everyone (load balancers and kubelets probe without credentials).
import { randomBytes, timingSafeEqual } from "node:crypto";
import { mkdir, readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import * as grpc from "@grpc/grpc-js";

const GrpcMetadata = grpc.Metadata;
import { RpcError, Status } from "../errors.js";
import { createExclusive } from "../exclusive-file.js";
import { NAME, ROLES, createApiKey, type ApiKeys, type Caller, type Role } from "./api-keys.js";

export { NAME };

export interface Identity {
  tenant: string;
  principal: string;
}

/** The development key's identity (`troupe up` makes its key); operator tools default to it. */
export const DEV_IDENTITY: Identity = { tenant: "local", principal: "dev" };

export const AUTHORIZATION = "authorization";
export const INTERNAL_TOKEN = "troupe-internal-token";
export const TENANT = "troupe-tenant";
export const PRINCIPAL = "troupe-principal";
/** Set by the gateway's check for its own handlers only (never passed on): the key's role, channels and hash. */
const ROLE = "troupe-role";
const CHANNELS = "troupe-channels";
const KEY_HASH = "troupe-key-hash";

/** Methods anyone may call. */
const OPEN_PATHS = [
  "/grpc.health.v1.Health/",
  "/grpc.reflection.v1.ServerReflection/",
  "/grpc.reflection.v1alpha.ServerReflection/",
];
export const isOpenPath = (path: string): boolean => OPEN_PATHS.some((p) => path.startsWith(p));

/** Checks a call's metadata; throws RpcError to refuse it. May replace headers (verified identity). */
export type Authenticator = (metadata: grpc.Metadata, path: string) => void;

/** Where a data directory keeps its keys. */
export const authPaths = (dataDir: string) => ({
  dir: path.join(dataDir, "auth"),
  keys: path.join(dataDir, "auth", "api-keys.json"),
  devKey: path.join(dataDir, "auth", "dev-key"),
  internalToken: path.join(dataDir, "auth", "internal-token"),
});

/**
 * The development key of a local stack: made on first start (tenant "local", principal "dev")
 * and kept in the data directory, readable by its owner only, so `troupe chat` on the same
 * machine works without configuration.
 */
export async function ensureDevKey(
  dataDir: string,
  keysFile = authPaths(dataDir).keys,
): Promise<{ key: string; created: boolean }> {
  const paths = authPaths(dataDir);
  const existing = await readFile(paths.devKey, "utf8").then(
    (t) => t.trim(),
    () => "",
  );
  if (existing) return { key: existing, created: false };
  const key = await createApiKey(keysFile, { ...DEV_IDENTITY, id: "dev" });
  // The keys file may live elsewhere (--api-keys): the data directory's auth folder is made here.
  await mkdir(paths.dir, { recursive: true, mode: 0o700 });
  await writeFile(paths.devKey, `${key}\n`, { mode: 0o600 });
  return { key, created: true };
}

/** The API key a local client uses: TROUPE_API_KEY, else the data directory's development key. */
export async function clientApiKey(dataDir: string, configured = ""): Promise<string> {
  if (configured) return configured;
  const key = await readFile(authPaths(dataDir).devKey, "utf8").then(
    (t) => t.trim(),
    () => "",
  );
  if (!key)
    throw new Error(
      `no API key: set TROUPE_API_KEY, or start the stack with \`troupe up\` (it makes a development key in ${authPaths(dataDir).devKey})`,
    );
  return key;
}

/**
 * The secret Troupe's services share: TROUPE_INTERNAL_TOKEN, else the data directory's token,
 * made by whichever process needs it first (processes of one machine share the directory; a
 * cluster sets the variable from a Secret).
 */
export async function internalToken(dataDir: string, configured = ""): Promise<string> {
  if (configured) return configured;
  const paths = authPaths(dataDir);
  const read = () =>
    readFile(paths.internalToken, "utf8").then(
      (t) => t.trim(),
      () => "",
    );
  const found = await read();
  if (found) return found;
  await mkdir(paths.dir, { recursive: true, mode: 0o700 });
  await createExclusive(paths.internalToken, `${randomBytes(32).toString("base64url")}\n`, 0o600);
  // Created here or by a process that got there first: either way, the file is the answer.
  return read();
}

// ---------------------------------------------------------------------------------------------
// Server-side checks

const unauthenticated = (message: string) => new RpcError(Status.UNAUTHENTICATED, message);

function bearer(metadata: grpc.Metadata): string | undefined {
  const value = metadata.get(AUTHORIZATION)[0];
  if (typeof value !== "string") return undefined;
  const m = /^Bearer\s+(\S+)\s*$/i.exec(value);
  return m?.[1];
}

/** The gateway's check: a known API key; what it stands for replaces anything the client claimed. */
export function apiKeyAuth(keys: ApiKeys): Authenticator {
  return (metadata) => {
    for (const k of [TENANT, PRINCIPAL, INTERNAL_TOKEN, ROLE, CHANNELS, KEY_HASH]) metadata.remove(k);
    const key = bearer(metadata);
    if (key === undefined)
      throw unauthenticated("missing credentials: send the metadata `authorization: Bearer <API key>`");
    const caller = keys.verify(key);
    if (!caller) throw unauthenticated("unknown API key");
    metadata.remove(AUTHORIZATION);
    metadata.set(TENANT, caller.tenant);
    metadata.set(PRINCIPAL, caller.principal);
    metadata.set(ROLE, caller.role);
    metadata.set(CHANNELS, caller.channels.join(","));
    metadata.set(KEY_HASH, caller.keyHash);
  };
}

/** At the gateway: the verified key a call came with (set by apiKeyAuth). */
export function callerOf(metadata: grpc.Metadata): Caller {
  const { tenant, principal } = identityOf(metadata);
  const role = metadata.get(ROLE)[0];
  const channels = metadata.get(CHANNELS)[0];
  const keyHash = metadata.get(KEY_HASH)[0];
  if (typeof role !== "string" || !ROLES.includes(role as Role) || typeof keyHash !== "string")
    throw unauthenticated("the call carries no verified API key");
  return {
    tenant,
    principal,
    role: role as Role,
    channels: typeof channels === "string" && channels !== "" ? channels.split(",") : [],
    keyHash,
  };
}

/** Every other service's check: the internal token. */
export function internalAuth(token: string): Authenticator {
  const want = Buffer.from(token);
  return (metadata) => {
    const got = metadata.get(INTERNAL_TOKEN)[0];
    if (typeof got !== "string")
      throw unauthenticated(
        "this is an internal Troupe service: calls need the internal token (clients call the gateway)",
      );
    const given = Buffer.from(got);
    if (given.length !== want.length || !timingSafeEqual(given, want)) throw unauthenticated("wrong internal token");
  };
}

/** The verified identity a call carries (set by apiKeyAuth, or passed on by the gateway). */
export function identityOf(metadata: grpc.Metadata): Identity {
  const tenant = metadata.get(TENANT)[0];
  const principal = metadata.get(PRINCIPAL)[0];
  if (typeof tenant !== "string" || typeof principal !== "string" || !NAME.test(tenant) || !NAME.test(principal)) {
    throw unauthenticated("the call carries no caller identity");
  }
  return { tenant, principal };
}

/** Headers that carry an identity on to another service. */
export function identityHeaders(id: Identity): Record<string, string> {
  return { [TENANT]: id.tenant, [PRINCIPAL]: id.principal };
}

/** The same headers as call metadata. */
export function identityMetadata(id: Identity): grpc.Metadata {
  const md = new GrpcMetadata();
  md.set(TENANT, id.tenant);
  md.set(PRINCIPAL, id.principal);
  return md;
}

/** The caller's verified identity (set by apiKeyAuth), carried on to the runner, which serves a session only to its owner. */
export const onBehalfOf = (call: { metadata: grpc.Metadata }): grpc.Metadata =>
  identityMetadata(identityOf(call.metadata));

export const sameIdentity = (a: Identity, b: Identity): boolean => a.tenant === b.tenant && a.principal === b.principal;

/** What one of Troupe's internal services needs: the check for its server, headers for its clients. */
export async function internalCredentials(
  dataDir: string,
  configured = "",
  caFile = "",
): Promise<{ authenticate: Authenticator; headers: Record<string, string>; tls?: { ca: Buffer } }> {
  const token = await internalToken(dataDir, configured);
  const tls = caFile ? { ca: await readFile(caFile) } : undefined;
  return { authenticate: internalAuth(token), headers: { [INTERNAL_TOKEN]: token }, tls };
}

/**
 * How an internal service listens: with its certificate when TLS between services is on (an
 * internal CA is configured), plain otherwise. On without a certificate is a configuration error.
 */
export function internalServing(
  cfg: { internalCa: string; tls?: { certFile: string; keyFile: string } },
  service: string,
): { certFile: string; keyFile: string } | undefined {
  if (!cfg.internalCa) return undefined;
  if (!cfg.tls)
    throw new Error(
      `TROUPE_INTERNAL_TLS_CA is set, so the ${service} serves TLS: it needs --tls-cert and --tls-key (TROUPE_TLS_CERT, TROUPE_TLS_KEY)`,
    );
  return cfg.tls;
}
