// The API keys a gateway accepts, and the keys file operators edit with `troupe keys`.
//
// A key stands for a tenant and a principal, and has a role:
// - `user`: opens and uses its own sessions (the default);
// - `adapter`: a channel adapter (a Telegram bot, a Slack app); it may call Deliver, speaking for
//   the senders of the channels the key names and no others, and may mark a sender as allowed to
//   use commands;
// - `approver`: a user who may also decide on the tool calls other principals' sessions of its
//   tenant hold for approval (DecideToolCall naming the session's principal);
// - `admin`: an operator.
// Only keys' SHA-256 hashes are stored; the key itself is shown once, when it is made.
import { createHash, randomBytes } from "node:crypto";
import { mkdir, readFile } from "node:fs/promises";
import path from "node:path";
import { replaceFile } from "../exclusive-file.js";
import { parseJson, schemaProblems } from "../json-schema.js";
import { ReloadingFile } from "../config/reloading-file.js";

export const ROLES = ["user", "adapter", "approver", "admin"] as const;
export type Role = (typeof ROLES)[number];

/** Tenants become memory scopes and file names: a strict alphabet. */
export const NAME = /^[A-Za-z0-9._:@-]{1,128}$/;
// Principals too, less ':' (schemas/api-keys.schema.json): a channel sender's memory owner always
// holds one ("telegram:777"), so no sender is the same memory owner as a principal unless
// routing links them.

export interface Caller {
  tenant: string;
  principal: string;
  role: Role;
  /** For an adapter key: the channels it speaks for. */
  channels: string[];
  /** The key's hash: what a revocation is checked against. */
  keyHash: string;
}

export interface StoredKey {
  /** A name for the key, for operators (never the key); unique in the file. */
  id: string;
  tenant: string;
  principal: string;
  role: Role;
  channels: string[];
  sha256: string;
  createdMs?: number;
}

export const sha256 = (text: string): string => createHash("sha256").update(text).digest("hex");

/** A new API key: a prefix that says what it is, then 32 random bytes. */
export const newApiKey = (): string => `trp_${randomBytes(32).toString("base64url")}`;

/**
 * The keys file: `{"keys": [{"id", "tenant", "principal", "role", "channels", "sha256"}]}`, checked
 * against shared/schemas/api-keys.schema.json and then for what a schema cannot say.
 */
export function parseKeys(text: string, source: string): StoredKey[] {
  const doc = parseJson(text, source);
  const schemaSays = schemaProblems("api-keys", doc);
  if (schemaSays.length > 0) throw new Error(`${source}: ${schemaSays.join("; ")}`);
  const ids = new Set<string>();
  return (doc as { keys: Partial<StoredKey>[] }).keys.map((raw, i) => {
    const k: StoredKey = {
      id: raw.id || `key-${i}`,
      tenant: raw.tenant!,
      principal: raw.principal!,
      role: raw.role ?? "user",
      channels: raw.channels ?? [],
      sha256: raw.sha256!,
      ...(raw.createdMs !== undefined ? { createdMs: raw.createdMs } : {}),
    };
    if (k.role !== "adapter" && k.channels.length > 0)
      throw new Error(`${source}: keys[${i}].channels is for adapter keys only`);
    if (ids.has(k.id)) throw new Error(`${source}: keys[${i}].id ${k.id} is used twice`);
    ids.add(k.id);
    return k;
  });
}

const callerOf = (k: StoredKey): Caller => ({
  tenant: k.tenant,
  principal: k.principal,
  role: k.role,
  channels: k.channels,
  keyHash: k.sha256,
});

/**
 * The keys a gateway accepts: the keys file (re-read when it changes, so keys are added and
 * revoked without a restart) and TROUPE_API_KEYS (the same JSON, for deployments configured
 * through the environment).
 */
export class ApiKeys {
  private byHash = new Map<string, Caller>();
  private readonly recent = new Map<string, Caller>();
  private readonly file: ReloadingFile<StoredKey[]>;
  /** The file's keys as last parsed whole. */
  private fileKeys: StoredKey[] = [];
  private readonly listeners: (() => void)[] = [];

  private constructor(
    file: string,
    private readonly envKeys: StoredKey[],
  ) {
    this.file = new ReloadingFile(
      file,
      (text, source) => this.parseOrSalvage(text, source),
      [],
      (keys) => {
        this.fileKeys = keys;
        this.index(keys);
      },
    );
  }

  static async load(file: string, envJson = ""): Promise<ApiKeys> {
    const keys = new ApiKeys(file, envJson ? parseKeys(envJson, "TROUPE_API_KEYS") : []);
    // The first read always reports a change (a missing file as no keys), which indexes the keys.
    await keys.reload();
    return keys;
  }

  /**
   * A file that stops parsing (a bad hand edit) is reported, and keeps only those of its last
   * good keys whose hash still stands in its text: a key removed in the same edit is gone at once.
   */
  private parseOrSalvage(text: string, source: string): StoredKey[] {
    try {
      return parseKeys(text, source);
    } catch (err) {
      this.index(this.fileKeys.filter((k) => text.includes(k.sha256)));
      throw err;
    }
  }

  private index(fileKeys: StoredKey[]): void {
    const next = new Map<string, Caller>();
    for (const k of [...fileKeys, ...this.envKeys]) next.set(k.sha256, callerOf(k));
    const removed = [...this.byHash.keys()].some((h) => !next.has(h));
    this.recent.clear();
    this.byHash = next;
    if (removed) for (const l of this.listeners) l();
  }

  get size(): number {
    return this.byHash.size;
  }

  /** Called after keys were revoked (removed from the file): open streams check theirs. */
  onRevoked(listener: () => void): void {
    this.listeners.push(listener);
  }

  /** Whether the key of this hash is still accepted. */
  holds(keyHash: string): boolean {
    return this.byHash.has(keyHash);
  }

  /** Re-reads the keys file if it changed; see parseOrSalvage for a file that no longer parses. */
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
   * Who a key stands for, or undefined. The lookup is by hash: nothing to time. Keys seen
   * recently skip the hashing (a client sends its key on every call); the memo holds only keys
   * that were valid and is cleared whenever the keys change, so a revoked key fails at once.
   */
  verify(key: string): Caller | undefined {
    const known = this.recent.get(key);
    if (known) return known;
    const caller = this.byHash.get(sha256(key));
    if (caller) {
      if (this.recent.size >= RECENT_KEYS) this.recent.clear();
      this.recent.set(key, caller);
    }
    return caller;
  }
}

/** Valid keys remembered unhashed (see ApiKeys.verify); past this many the memo starts over. */
const RECENT_KEYS = 10_000;

async function readKeysFile(keysFile: string): Promise<StoredKey[]> {
  return readFile(keysFile, "utf8").then(
    (t) => parseKeys(t, keysFile),
    (err: NodeJS.ErrnoException) => {
      if (err.code === "ENOENT") return [] as StoredKey[];
      throw err;
    },
  );
}

/** Replaces the keys file atomically, so a gateway never reads half of it. */
async function writeKeysFile(keysFile: string, keys: StoredKey[]): Promise<void> {
  await mkdir(path.dirname(keysFile), { recursive: true, mode: 0o700 });
  await replaceFile(keysFile, `${JSON.stringify({ keys }, null, 2)}\n`, 0o600);
}

export interface NewKey {
  tenant: string;
  principal: string;
  id: string;
  role?: Role;
  channels?: string[];
}

/** Adds a key to a keys file and returns the key (shown once; only its hash is kept). */
export async function createApiKey(keysFile: string, spec: NewKey): Promise<string> {
  const key = newApiKey();
  const [stored] = parseKeys(
    JSON.stringify({
      keys: [
        {
          ...spec,
          role: spec.role ?? "user",
          channels: spec.channels ?? [],
          sha256: sha256(key),
          createdMs: Date.now(),
        },
      ],
    }),
    "the new key",
  );
  if (stored.role === "adapter" && stored.channels.length === 0)
    throw new Error("an adapter key names the channels it speaks for (--channel)");
  const existing = await readKeysFile(keysFile);
  if (existing.some((k) => k.id === spec.id)) throw new Error(`a key named ${spec.id} exists; choose another --name`);
  await writeKeysFile(keysFile, [...existing, stored]);
  return key;
}

/** The keys a file holds (hashes included; never the keys). */
export const listApiKeys = (keysFile: string): Promise<StoredKey[]> => readKeysFile(keysFile);

/** Removes the key named `id`; false if there is none. A running gateway ends its streams within seconds. */
export async function revokeApiKey(keysFile: string, id: string): Promise<boolean> {
  const existing = await readKeysFile(keysFile);
  const kept = existing.filter((k) => k.id !== id);
  if (kept.length === existing.length) return false;
  await writeKeysFile(keysFile, kept);
  return true;
}
