// Who may write to an adapter's bot in private, under the `pairing` DM policy (dm-gate.ts): the
// senders the operator approved, and the strangers waiting with a one-time code. One JSON file
// beside the adapter's state (`<state>.pairing.json`), written by the adapter alone. The operator
// acts through `troupe pairing` (cli/pairing.ts), which never writes that file: it drops a request
// in the folder beside it (`<state>.pairing.d/approve.CODE`, `reject.CODE`, `revoke.<sender>`),
// and the adapter carries requests out within a second and removes them. So the book has one
// writer, and an adapter that is down finds the operator's word when it starts.
import { randomInt } from "node:crypto";
import { mkdir, readdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import path from "node:path";

/** A stranger waiting for the operator. */
export interface PendingSender {
  code: string;
  senderId: string;
  name: string;
  /** Where to tell them they were let in (the platform's address of their private chat). */
  chat: Record<string, string>;
  createdMs: number;
}

export interface AllowedSender {
  senderId: string;
  name: string;
  approvedMs: number;
}

interface BookFile {
  pending: PendingSender[];
  allowed: AllowedSender[];
}

/** 32 symbols with no 0/O or 1/I to misread: 8 of them are 40 bits. */
const ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789";
export const CODE = /^[A-HJ-NP-Z2-9]{8}$/;
/** A code is good for an hour, as a stranger's first message is answered at once or not at all. */
export const CODE_TTL_MS = 60 * 60_000;
/** Strangers waiting at once, at most; more get no code until some are decided or expire. */
export const MAX_PENDING = 100;

export const pairingFiles = (stateFile: string) => {
  const base = stateFile.replace(/\.json$/, "");
  return { book: `${base}.pairing.json`, requests: `${base}.pairing.d` };
};

/** A request `troupe pairing` drops for the adapter: the file's name says it all. */
export type PairingRequest = { verb: "approve" | "reject"; code: string } | { verb: "revoke"; senderId: string };

export function requestFileName(r: PairingRequest): string {
  return r.verb === "revoke" ? `revoke.${Buffer.from(r.senderId).toString("base64url")}` : `${r.verb}.${r.code}`;
}

function parseRequest(name: string): PairingRequest | undefined {
  const [verb, arg = ""] = name.split(".", 2);
  if ((verb === "approve" || verb === "reject") && CODE.test(arg)) return { verb, code: arg };
  if (verb === "revoke" && /^[A-Za-z0-9_-]{1,400}$/.test(arg))
    return { verb, senderId: Buffer.from(arg, "base64url").toString("utf8") };
  return undefined;
}

export async function readBook(file: string): Promise<BookFile> {
  try {
    const doc = JSON.parse(await readFile(file, "utf8")) as Partial<BookFile>;
    return { pending: doc.pending ?? [], allowed: doc.allowed ?? [] };
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return { pending: [], allowed: [] };
    throw new Error(`${file}: not a pairing file (${(err as Error).message})`);
  }
}

export class PairingBook {
  private pending: PendingSender[] = [];
  private readonly allowed = new Map<string, AllowedSender>();
  private saving: Promise<void> = Promise.resolve();

  private constructor(private readonly files: ReturnType<typeof pairingFiles>) {}

  static async open(stateFile: string): Promise<PairingBook> {
    const book = new PairingBook(pairingFiles(stateFile));
    const doc = await readBook(book.files.book);
    book.pending = doc.pending;
    for (const a of doc.allowed) book.allowed.set(a.senderId, a);
    return book;
  }

  isAllowed(senderId: string): boolean {
    return this.allowed.has(senderId);
  }

  /**
   * The stranger's code, and whether it is new (and so to be told). Undefined when MAX_PENDING
   * strangers wait already.
   */
  async codeFor(
    senderId: string,
    name: string,
    chat: Record<string, string>,
    now = Date.now(),
  ): Promise<{ code: string; fresh: boolean } | undefined> {
    this.pending = this.pending.filter((p) => now - p.createdMs < CODE_TTL_MS);
    const waiting = this.pending.find((p) => p.senderId === senderId);
    if (waiting) return { code: waiting.code, fresh: false };
    if (this.pending.length >= MAX_PENDING) return undefined;
    let code: string;
    do code = Array.from({ length: 8 }, () => ALPHABET[randomInt(ALPHABET.length)]).join("");
    while (this.pending.some((p) => p.code === code));
    this.pending.push({ code, senderId, name, chat, createdMs: now });
    await this.save();
    return { code, fresh: true };
  }

  /**
   * Carries out the requests `troupe pairing` left, oldest name first; returns who was let in
   * (to be told). A request for a code no stranger holds (expired, or never given) is dropped.
   */
  async takeRequests(now = Date.now()): Promise<PendingSender[]> {
    const names = await readdir(this.files.requests).catch(() => [] as string[]);
    if (names.length === 0) return [];
    const admitted: PendingSender[] = [];
    for (const name of names.sort()) {
      const r = parseRequest(name);
      if (r?.verb === "revoke") this.allowed.delete(r.senderId);
      else if (r) {
        const at = this.pending.findIndex((p) => p.code === r.code && now - p.createdMs < CODE_TTL_MS);
        if (at >= 0) {
          const [p] = this.pending.splice(at, 1);
          if (r.verb === "approve") {
            this.allowed.set(p.senderId, { senderId: p.senderId, name: p.name, approvedMs: now });
            admitted.push(p);
          }
        }
      }
      await rm(path.join(this.files.requests, name), { force: true });
    }
    await this.save();
    return admitted;
  }

  private save(): Promise<void> {
    const doc: BookFile = { pending: this.pending, allowed: [...this.allowed.values()] };
    const text = JSON.stringify(doc, null, 1);
    this.saving = this.saving.then(async () => {
      await mkdir(path.dirname(this.files.book), { recursive: true });
      await writeFile(`${this.files.book}.tmp`, text, { mode: 0o600 });
      await rename(`${this.files.book}.tmp`, this.files.book);
    });
    return this.saving;
  }
}
