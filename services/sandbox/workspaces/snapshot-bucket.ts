// Snapshots in a bucket on S3 or S3-compatible storage (MinIO, Ceph, R2 and the like), through the
// AWS SDK, so its credential chain applies (environment, shared config files, web identity on
// Kubernetes, instance roles) and nothing secret goes in the setting. Keys are
// `<prefix><folder>/<id>.tar` and `.json`. An archive is uploaded with its SHA-256, which the
// storage checks, and read back with checksum mode on, which the SDK checks. Sandboxes read
// archives from local files, so a read downloads into the data directory's snapshot-cache/, which
// keeps the CACHED most recently used archives (a snapshot never changes once made). What a crash
// left of a write is swept at the next start.
import { createHash } from "node:crypto";
import { createReadStream, createWriteStream } from "node:fs";
import { mkdir, readdir, rename, rm, stat, utimes } from "node:fs/promises";
import path from "node:path";
import type { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import type * as S3 from "@aws-sdk/client-s3";
import { invalidArgument, unavailable } from "../../shared/errors.js";
import { lazyModule } from "../../shared/process/lazy-module.js";
import { STALE_MS, type SnapshotStore, type StoreContext } from "./snapshot-store.js";

const sdk = lazyModule<typeof S3>("@aws-sdk/client-s3");
const CACHED = 8;
const PARAMS = new Set(["region", "endpoint", "path-style"]);

interface SdkError {
  name?: string;
  message?: string;
}
/** An object that is not there (a bucket that is not there is the store's failure, not this). */
const missing = (err: unknown) => {
  const name = (err as SdkError).name;
  return name === "NoSuchKey" || name === "NotFound";
};

async function sha256Of(file: string): Promise<string> {
  const hash = createHash("sha256");
  for await (const chunk of createReadStream(file)) hash.update(chunk as Buffer);
  return hash.digest("base64");
}

/** s3://bucket[/prefix][?region=R&endpoint=URL&path-style=true|false]; path style is the default with an endpoint. */
export function bucketStore(url: URL, ctx: StoreContext): SnapshotStore {
  const bucket = url.hostname;
  if (!bucket) throw invalidArgument("TROUPE_SANDBOX_SNAPSHOTS: s3:// needs a bucket (s3://bucket/prefix)");
  for (const key of url.searchParams.keys())
    if (!PARAMS.has(key))
      throw invalidArgument(`TROUPE_SANDBOX_SNAPSHOTS: unknown parameter "${key}" (known: ${[...PARAMS].join(", ")})`);
  let prefix = decodeURIComponent(url.pathname).replace(/^\/+/, "");
  if (prefix !== "" && !prefix.endsWith("/")) prefix += "/";
  const endpoint = url.searchParams.get("endpoint") ?? undefined;
  const pathStyle = url.searchParams.get("path-style");
  if (pathStyle !== null && pathStyle !== "true" && pathStyle !== "false")
    throw invalidArgument(`TROUPE_SANDBOX_SNAPSHOTS: path-style is true or false, not "${pathStyle}"`);
  const where = `s3://${bucket}/${prefix}`;
  let client: S3.S3Client | undefined;
  const s3 = () =>
    (client ??= new (sdk().S3Client)({
      // S3-compatible storage mostly ignores the region; AWS finds it in its usual settings.
      region: url.searchParams.get("region") ?? (endpoint ? "us-east-1" : undefined),
      endpoint,
      forcePathStyle: pathStyle === null ? endpoint !== undefined : pathStyle === "true",
      // Checksums are sent and asked for explicitly below; this keeps uploads plain (not
      // aws-chunked), which every S3-compatible store takes.
      requestChecksumCalculation: "WHEN_REQUIRED",
      responseChecksumValidation: "WHEN_REQUIRED",
    }));
  /** Sends an SDK command; a missing object's error as it is, any other as UNAVAILABLE naming the store. */
  const send = async <T = unknown>(what: string, command: object): Promise<T> => {
    try {
      return (await s3().send(command as never)) as T;
    } catch (err) {
      if (missing(err)) throw err;
      const e = err as SdkError;
      throw unavailable(`snapshot store ${where}: ${what} failed: ${e.name ?? "Error"}: ${e.message ?? ""}`.trim());
    }
  };
  const key = (name: string, ext: string) => `${prefix}${name}.${ext}`;
  /** The store's objects under `under`, page by page: each `<folder>/<id>` with its kind and age. */
  async function* listed(under: string): AsyncGenerator<{ name: string; ext: "json" | "tar"; modifiedMs: number }> {
    let token: string | undefined;
    do {
      const page = await send<S3.ListObjectsV2CommandOutput>(
        "listing snapshots",
        new (sdk().ListObjectsV2Command)({ Bucket: bucket, Prefix: under, ContinuationToken: token }),
      );
      for (const o of page.Contents ?? []) {
        const m = /^([^/]+\/[^/]+)\.(json|tar)$/.exec(o.Key?.slice(prefix.length) ?? "");
        if (m) yield { name: m[1]!, ext: m[2] as "json" | "tar", modifiedMs: o.LastModified?.getTime() ?? Date.now() };
      }
      token = page.IsTruncated ? page.NextContinuationToken : undefined;
    } while (token);
  }

  const cacheDir = path.join(ctx.dataDir, "snapshot-cache");
  // Folder parts never contain "." (session-ref.ts filePart), so this flattening is injective.
  const cached = (name: string) => path.join(cacheDir, `${name.replace("/", ".")}.tar`);
  const trimCache = async () => {
    const files = await readdir(cacheDir).catch(() => [] as string[]);
    const aged = await Promise.all(
      files.map(async (f) => ({ f, at: (await stat(path.join(cacheDir, f)).catch(() => undefined))?.mtimeMs ?? 0 })),
    );
    const hourAgo = Date.now() - 3_600_000;
    const tars = aged.filter((a) => a.f.endsWith(".tar")).sort((a, b) => b.at - a.at);
    const stale = [...tars.slice(CACHED), ...aged.filter((a) => a.f.endsWith(".partial") && a.at < hourAgo)];
    await Promise.all(stale.map((a) => rm(path.join(cacheDir, a.f), { force: true })));
  };
  const downloads = new Map<string, Promise<string | undefined>>();
  const download = async (name: string): Promise<string | undefined> => {
    const file = cached(name);
    let body: S3.GetObjectCommandOutput["Body"];
    try {
      ({ Body: body } = await send<S3.GetObjectCommandOutput>(
        "reading an archive",
        new (sdk().GetObjectCommand)({ Bucket: bucket, Key: key(name, "tar"), ChecksumMode: "ENABLED" }),
      ));
    } catch (err) {
      if (missing(err)) return undefined;
      throw err;
    }
    await mkdir(cacheDir, { recursive: true, mode: 0o700 });
    try {
      await pipeline(body as Readable, createWriteStream(`${file}.partial`, { mode: 0o600 }));
      await rename(`${file}.partial`, file);
    } catch (err) {
      await rm(`${file}.partial`, { force: true });
      throw unavailable(`snapshot store ${where}: reading an archive failed: ${(err as Error).message}`);
    }
    void trimCache();
    return file;
  };

  return {
    where,
    async staging(name) {
      await mkdir(cacheDir, { recursive: true, mode: 0o700 });
      return `${cached(name)}.partial`;
    },
    async putArchive(name, staged, bytes) {
      try {
        await send(
          "writing an archive",
          new (sdk().PutObjectCommand)({
            Bucket: bucket,
            Key: key(name, "tar"),
            Body: createReadStream(staged),
            ContentLength: bytes,
            ContentType: "application/x-tar",
            ChecksumSHA256: await sha256Of(staged),
          }),
        );
      } catch (err) {
        await rm(staged, { force: true });
        throw err;
      }
      // The archive just made is the one most likely read next (a restore, a template).
      await rename(staged, cached(name));
      void trimCache();
    },
    async archive(name) {
      const file = cached(name);
      const now = new Date();
      if (
        await utimes(file, now, now).then(
          () => true,
          () => false,
        )
      )
        return file;
      let pending = downloads.get(name);
      if (!pending) {
        pending = download(name).finally(() => downloads.delete(name));
        downloads.set(name, pending);
      }
      return pending;
    },
    async putRecord(name, value) {
      await send(
        "writing a record",
        new (sdk().PutObjectCommand)({
          Bucket: bucket,
          Key: key(name, "json"),
          Body: JSON.stringify(value),
          ContentType: "application/json",
        }),
      );
    },
    async readRecord<T>(name: string) {
      try {
        const out = await send<S3.GetObjectCommandOutput>(
          "reading a record",
          new (sdk().GetObjectCommand)({ Bucket: bucket, Key: key(name, "json") }),
        );
        return JSON.parse(await out.Body!.transformToString("utf8")) as T;
      } catch (err) {
        if (missing(err) || err instanceof SyntaxError) return undefined;
        throw err;
      }
    },
    async names(folder) {
      const names: string[] = [];
      for await (const o of listed(folder === undefined ? prefix : `${prefix}${folder}/`))
        if (o.ext === "json") names.push(o.name);
      return names;
    },
    // A crash between the archive and its record leaves `<id>.tar` alone: never listed, never
    // counted. Taken once it is over STALE_MS old (a write in flight elsewhere is younger).
    async sweep() {
      const records = new Set<string>();
      const archives: { name: string; at: number }[] = [];
      for await (const o of listed(prefix))
        if (o.ext === "json") records.add(o.name);
        else archives.push({ name: o.name, at: o.modifiedMs });
      const before = Date.now() - STALE_MS;
      let removed = 0;
      for (const { name, at } of archives) {
        if (records.has(name) || at >= before) continue;
        await send("sweeping an archive", new (sdk().DeleteObjectCommand)({ Bucket: bucket, Key: key(name, "tar") }));
        removed++;
      }
      return removed;
    },
    async remove(name) {
      for (const ext of ["json", "tar"])
        await send("deleting a snapshot", new (sdk().DeleteObjectCommand)({ Bucket: bucket, Key: key(name, ext) }));
      await rm(cached(name), { force: true });
    },
  };
}
