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
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import { mkdir, readFile, rename, writeFile } from "node:fs/promises";
import path from "node:path";
import type * as grpc from "@grpc/grpc-js";
import { RpcError, Status } from "./errors.js";
import { createExclusive } from "./exclusive-file.js";
import { ReloadingFile } from "./reloading-file.js";

export interface Identity {
  tenant: string;
  principal: string;
}

export const AUTHORIZATION = "authorization";
export const INTERNAL_TOKEN = "troupe-internal-token";
export const TENANT = "troupe-tenant";
export const PRINCIPAL = "troupe-principal";

/** Tenants and principals become memory scopes and file names: the same strict alphabet. */
export const NAME = /^[A-Za-z0-9._:@-]{1,128}$/;

/** Methods anyone may call. */
const OPEN_PATHS = ["/grpc.health.v1.Health/", "/grpc.reflection.v1.ServerReflection/", "/grpc.reflection.v1alpha.ServerReflection/"];
export const isOpenPath = (path: string): boolean => OPEN_PATHS.some((p) => path.startsWith(p));

/** Checks a call's metadata; throws RpcError to refuse it. May replace headers (verified identity). */
export type Authenticator = (metadata: grpc.Metadata, path: string) => void;

export const sha256 = (text: string): string => createHash("sha256").update(text).digest("hex");

/** A new API key: a prefix that says what it is, then 32 random bytes. */
export const newApiKey = (): string => `trp_${randomBytes(32).toString("base64url")}`;

export interface StoredKey extends Identity {
  /** A name for the key, for operators (never the key). */
  id: string;
  sha256: string;
}

/** The keys file: `{"keys": [{"id", "tenant", "principal", "sha256"}]}`. */
export function parseKeys(text: string, source: string): StoredKey[] {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    throw new Error(`${source}: not JSON (${(err as Error).message})`);
  }
  const keys = (doc as { keys?: unknown }).keys;
  if (!Array.isArray(keys)) throw new Error(`${source}: expected {"keys": [...]}`);
  return keys.map((k: Partial<StoredKey>, i) => {
    for (const field of ["tenant", "principal"] as const) {
      if (typeof k[field] !== "string" || !NAME.test(k[field])) throw new Error(`${source}: keys[${i}].${field} must match ${NAME}`);
    }
    if (typeof k.sha256 !== "string" || !/^[0-9a-f]{64}$/.test(k.sha256)) throw new Error(`${source}: keys[${i}].sha256 must be 64 hex digits`);
    return { id: typeof k.id === "string" ? k.id : `key-${i}`, tenant: k.tenant!, principal: k.principal!, sha256: k.sha256 };
  });
}

/**
 * The API keys a gateway accepts: the keys file (re-read when it changes, so keys can be added
 * or revoked without a restart) and TROUPE_API_KEYS (the same JSON, for deployments that
 * configure through the environment).
 */
export class ApiKeys {
  private byHash = new Map<string, Identity>();
  private readonly recent = new Map<string, Identity>();
  private readonly file: ReloadingFile<StoredKey[]>;

  private constructor(
    file: string,
    private readonly envKeys: StoredKey[],
  ) {
    this.file = new ReloadingFile(file, parseKeys, [], (fileKeys) => this.index(fileKeys));
  }

  static async load(file: string, envJson = ""): Promise<ApiKeys> {
    const keys = new ApiKeys(file, envJson ? parseKeys(envJson, "TROUPE_API_KEYS") : []);
    // The first read always reports a change (a missing file as no keys), which indexes the keys.
    await keys.reload();
    return keys;
  }

  private index(fileKeys: StoredKey[]): void {
    const next = new Map<string, Identity>();
    for (const k of [...fileKeys, ...this.envKeys]) next.set(k.sha256, { tenant: k.tenant, principal: k.principal });
    if (!sameKeys(this.byHash, next)) this.recent.clear();
    this.byHash = next;
  }

  get size(): number {
    return this.byHash.size;
  }

  /** Re-reads the keys file if it changed; a file that no longer parses keeps the last good keys. */
  reload(): Promise<void> {
    return this.file.reload();
  }

  /** Checks the file every intervalMs until stop(). */
  watch(intervalMs: number, onError: (err: unknown) => void): void {
    this.file.watch(intervalMs, onError);
  }

  stop(): void {
    this.file.stop();
  }

  /**
   * The identity a key stands for, or undefined. The lookup is by hash: nothing to time. Keys seen
   * recently skip the hashing (a client sends its key on every call); the memo holds only keys
   * that were valid and is cleared whenever the keys change, so a revoked key fails at once.
   */
  verify(key: string): Identity | undefined {
    const known = this.recent.get(key);
    if (known) return known;
    const id = this.byHash.get(sha256(key));
    if (id) {
      if (this.recent.size >= RECENT_KEYS) this.recent.clear();
      this.recent.set(key, id);
    }
    return id;
  }
}

/** Valid keys remembered unhashed (see ApiKeys.verify); past this many the memo starts over. */
const RECENT_KEYS = 10_000;

function sameKeys(a: Map<string, Identity>, b: Map<string, Identity>): boolean {
  if (a.size !== b.size) return false;
  for (const [hash, id] of a) {
    const other = b.get(hash);
    if (!other || !sameIdentity(id, other)) return false;
  }
  return true;
}

/** Where a data directory keeps its keys. */
export const authPaths = (dataDir: string) => ({
  dir: path.join(dataDir, "auth"),
  keys: path.join(dataDir, "auth", "api-keys.json"),
  devKey: path.join(dataDir, "auth", "dev-key"),
  internalToken: path.join(dataDir, "auth", "internal-token"),
});

/**
 * Adds a key for tenant/principal to a keys file and returns the key (shown once; only its hash
 * is kept). The file is replaced atomically, so a gateway never reads half of it.
 */
export async function createApiKey(keysFile: string, tenant: string, principal: string, id: string): Promise<string> {
  for (const [field, value] of [["tenant", tenant], ["principal", principal]]) {
    if (!NAME.test(value)) throw new Error(`${field} must match ${NAME}`);
  }
  await mkdir(path.dirname(keysFile), { recursive: true, mode: 0o700 });
  const existing = await readFile(keysFile, "utf8").then(
    (t) => parseKeys(t, keysFile),
    (err: NodeJS.ErrnoException) => {
      if (err.code === "ENOENT") return [] as StoredKey[];
      throw err;
    },
  );
  const key = newApiKey();
  const keys = [...existing, { id, tenant, principal, sha256: sha256(key) }];
  const tmp = `${keysFile}.${process.pid}.tmp`;
  await writeFile(tmp, JSON.stringify({ keys }, null, 2) + "\n", { mode: 0o600 });
  await rename(tmp, keysFile);
  return key;
}

/**
 * The development key of a local stack: made on first start (tenant "local", principal "dev")
 * and kept in the data directory, readable by its owner only, so `troupe chat` on the same
 * machine works without configuration.
 */
export async function ensureDevKey(dataDir: string, keysFile = authPaths(dataDir).keys): Promise<{ key: string; created: boolean }> {
  const paths = authPaths(dataDir);
  const existing = await readFile(paths.devKey, "utf8").then((t) => t.trim(), () => "");
  if (existing) return { key: existing, created: false };
  const key = await createApiKey(keysFile, "local", "dev", "dev");
  // The keys file may live elsewhere (--api-keys): the data directory's auth folder is made here.
  await mkdir(paths.dir, { recursive: true, mode: 0o700 });
  await writeFile(paths.devKey, key + "\n", { mode: 0o600 });
  return { key, created: true };
}

/** The API key a local client uses: TROUPE_API_KEY, else the data directory's development key. */
export async function clientApiKey(dataDir: string, env: NodeJS.ProcessEnv = process.env): Promise<string> {
  if (env.TROUPE_API_KEY) return env.TROUPE_API_KEY;
  const key = await readFile(authPaths(dataDir).devKey, "utf8").then((t) => t.trim(), () => "");
  if (!key) throw new Error(`no API key: set TROUPE_API_KEY, or start the stack with \`troupe up\` (it makes a development key in ${authPaths(dataDir).devKey})`);
  return key;
}

/**
 * The secret Troupe's services share: TROUPE_INTERNAL_TOKEN, else the data directory's token,
 * made by whichever process needs it first (processes of one machine share the directory; a
 * cluster sets the variable from a Secret).
 */
export async function internalToken(dataDir: string, env: NodeJS.ProcessEnv = process.env): Promise<string> {
  if (env.TROUPE_INTERNAL_TOKEN) return env.TROUPE_INTERNAL_TOKEN;
  const paths = authPaths(dataDir);
  const read = () => readFile(paths.internalToken, "utf8").then((t) => t.trim(), () => "");
  const found = await read();
  if (found) return found;
  await mkdir(paths.dir, { recursive: true, mode: 0o700 });
  await createExclusive(paths.internalToken, randomBytes(32).toString("base64url") + "\n", 0o600);
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

/** The gateway's check: a known API key; its identity replaces any the client claimed. */
export function apiKeyAuth(keys: ApiKeys): Authenticator {
  return (metadata) => {
    for (const k of [TENANT, PRINCIPAL, INTERNAL_TOKEN]) metadata.remove(k);
    const key = bearer(metadata);
    if (key === undefined) throw unauthenticated("missing credentials: send the metadata `authorization: Bearer <API key>`");
    const id = keys.verify(key);
    if (!id) throw unauthenticated("unknown API key");
    metadata.remove(AUTHORIZATION);
    metadata.set(TENANT, id.tenant);
    metadata.set(PRINCIPAL, id.principal);
  };
}

/** Every other service's check: the internal token. */
export function internalAuth(token: string): Authenticator {
  const want = Buffer.from(token);
  return (metadata) => {
    const got = metadata.get(INTERNAL_TOKEN)[0];
    if (typeof got !== "string") throw unauthenticated("this is an internal Troupe service: calls need the internal token (clients call the gateway)");
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

export const sameIdentity = (a: Identity, b: Identity): boolean => a.tenant === b.tenant && a.principal === b.principal;

/** What one of Troupe's internal services needs: the check for its server, headers for its clients. */
export async function internalCredentials(dataDir: string, env: NodeJS.ProcessEnv = process.env): Promise<{ authenticate: Authenticator; headers: Record<string, string> }> {
  const token = await internalToken(dataDir, env);
  return { authenticate: internalAuth(token), headers: { [INTERNAL_TOKEN]: token } };
}
