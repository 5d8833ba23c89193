// Where snapshots are kept: the directory store and the S3 bucket store, each behind the same
// Snapshots, and the S3 endpoint the bucket store is tested against (test/helpers/s3-server.ts),
// itself held to AWS's published signing example and to the official @aws-sdk/client-s3.
// Through real processes and a real sandbox: test/snapshot-store.test.ts.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdir, mkdtemp, readdir, readFile, rm, utimes, writeFile } from "node:fs/promises";
import { createHash } from "node:crypto";
import { tmpdir } from "node:os";
import path from "node:path";
import {
  DeleteObjectCommand,
  GetObjectCommand,
  ListObjectsV2Command,
  PutObjectCommand,
  S3Client,
} from "@aws-sdk/client-s3";
import { snapshotStoreOf } from "../../services/sandbox/workspaces/snapshot-stores.js";
import { Snapshots } from "../../services/sandbox/workspaces/snapshots.js";
import { WorkspaceUsage } from "../../services/sandbox/workspaces/workspace-usage.js";
import { Status } from "../../services/shared/errors.js";
import { createLogger } from "../../services/shared/process/log.js";
import { S3Server, signatureV4 } from "../helpers/s3-server.js";

const KEYS = { accessKeyId: "AKIDTROUPETEST", secretAccessKey: "troupe-test-secret/0123456789abcdef" };
const logger = createLogger("test", "error");
const code = (want: Status, message?: RegExp) => (err: unknown) => {
  assert.equal((err as { code?: number }).code, want, String(err));
  if (message) assert.match((err as Error).message, message);
  return true;
};

test("the endpoint's signing matches AWS's published example (GET /test.txt, a range)", () => {
  // docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html, "Example: GET Object".
  const signature = signatureV4({
    method: "GET",
    path: "/test.txt",
    query: [],
    headers: {
      host: "examplebucket.s3.amazonaws.com",
      range: "bytes=0-9",
      "x-amz-content-sha256": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
      "x-amz-date": "20130524T000000Z",
    },
    signedHeaders: ["host", "range", "x-amz-content-sha256", "x-amz-date"],
    payloadHash: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    amzDate: "20130524T000000Z",
    region: "us-east-1",
    service: "s3",
    secretAccessKey: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
  });
  assert.equal(signature, "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
});

describe("stores", () => {
  const s3 = new S3Server({ bucket: "snaps", ...KEYS, pageKeys: 2 });
  const saved = { ...process.env };
  let dataDir: string;
  before(async () => {
    await s3.start();
    Object.assign(process.env, { AWS_ACCESS_KEY_ID: KEYS.accessKeyId, AWS_SECRET_ACCESS_KEY: KEYS.secretAccessKey });
    dataDir = await mkdtemp(path.join(tmpdir(), "troupe-snapshot-stores-"));
  });
  after(async () => {
    process.env = saved;
    await s3.stop();
    await rm(dataDir, { recursive: true, force: true });
  });

  test("the official SDK round-trips through the endpoint, and is refused as S3 refuses", async () => {
    const sdk = (secret = KEYS.secretAccessKey) =>
      new S3Client({
        region: "us-east-1",
        endpoint: s3.endpoint,
        forcePathStyle: true,
        credentials: { accessKeyId: KEYS.accessKeyId, secretAccessKey: secret },
      });
    const client = sdk();
    // The SDK's defaults, aws-chunked uploads included, are refused plainly rather than misread.
    for (const k of ["a/1", "a/2 with space+plus", "a/3", "b/1"])
      await client
        .send(new PutObjectCommand({ Bucket: "snaps", Key: k, Body: `body of ${k}`, ChecksumAlgorithm: "SHA256" }))
        .catch((err) => assert.fail(`put ${k}: ${err}`));
    const got = await client.send(
      new GetObjectCommand({ Bucket: "snaps", Key: "a/2 with space+plus", ChecksumMode: "ENABLED" }),
    );
    assert.equal(await got.Body!.transformToString(), "body of a/2 with space+plus");
    assert.ok(got.ChecksumSHA256, "the checksum comes back under checksum mode");
    const keys: string[] = [];
    let token: string | undefined;
    let pages = 0;
    do {
      const page = await client.send(
        new ListObjectsV2Command({ Bucket: "snaps", Prefix: "a/", ContinuationToken: token }),
      );
      keys.push(...(page.Contents ?? []).map((o) => o.Key!));
      token = page.NextContinuationToken;
      pages++;
    } while (token);
    assert.deepEqual(keys, ["a/1", "a/2 with space+plus", "a/3"]);
    assert.equal(pages, 2, "pages of two keys");
    await assert.rejects(
      client.send(new GetObjectCommand({ Bucket: "snaps", Key: "nope" })),
      (err: Error) => err.name === "NoSuchKey",
    );
    await assert.rejects(
      sdk("wrong").send(new GetObjectCommand({ Bucket: "snaps", Key: "a/1" })),
      (err: Error) => err.name === "SignatureDoesNotMatch",
    );
    await assert.rejects(
      client.send(new PutObjectCommand({ Bucket: "snaps", Key: "c", Body: "x", ChecksumSHA256: "AAAA" })),
      (err: Error) => err.name === "BadDigest",
    );
    const anonymous = await fetch(`${s3.endpoint}/snaps/a/1`);
    assert.equal(anonymous.status, 403);
    assert.match(await anonymous.text(), /<Code>AccessDenied<\/Code>/);
    for (const k of ["a/1", "a/2 with space+plus", "a/3", "b/1"])
      await client.send(new DeleteObjectCommand({ Bucket: "snaps", Key: k }));
    assert.equal(s3.objects.size, 0);
    client.destroy();
  });

  for (const kind of ["directory", "bucket"] as const) {
    const setting = () => (kind === "bucket" ? `s3://snaps/troupe/?endpoint=${s3.endpoint}` : "");
    const snapshotsOf = (usage: WorkspaceUsage, quota = 1 << 20) =>
      new Snapshots(snapshotStoreOf(setting(), { dataDir, logger }), usage, () => quota, logger);
    const writing =
      (text: string) =>
      async (target: string): Promise<number> => {
        await writeFile(target, text);
        return Buffer.byteLength(text);
      };

    test(`${kind}: made, listed, read back, counted after a restart, per tenant, deleted`, async () => {
      const usage = new WorkspaceUsage();
      const snapshots = snapshotsOf(usage);
      const a = await snapshots.create("acme", "s1", "first", writing("archive one"));
      const b = await snapshots.create("acme", "s2", "", writing("archive two!"));
      await snapshots.create("other co", "s1", "theirs", writing("xyz"));
      assert.deepEqual((await snapshots.list("acme")).map((r) => r.id).sort(), [a.id, b.id].sort());
      assert.equal(usage.of("acme"), 23);
      await assert.rejects(snapshots.get("other co", a.id), code(Status.NOT_FOUND, new RegExp(`no snapshot ${a.id}`)));
      await assert.rejects(
        snapshots.get("acme", "snap-00000000-0000-0000-0000-000000000000"),
        code(Status.NOT_FOUND, /no snapshot snap-0{8}-/),
        "a foreign one and a missing one answer alike",
      );
      if (kind === "bucket") {
        assert.ok(s3.objects.has(`troupe/acme/${a.id}.tar`) && s3.objects.has(`troupe/acme/${a.id}.json`));
        // A restarted service has no cache: the archive comes from the bucket.
        await rm(path.join(dataDir, "snapshot-cache"), { recursive: true, force: true });
      }
      const again = snapshotsOf(new WorkspaceUsage());
      const usageAgain = new WorkspaceUsage();
      const restarted = snapshotsOf(usageAgain);
      await restarted.ready();
      assert.equal(usageAgain.of("acme"), 23, "snapshots are counted again on start");
      assert.equal(usageAgain.of("other co"), 3);
      assert.equal(await readFile(await again.archiveOf(await again.get("acme", a.id)), "utf8"), "archive one");

      await restarted.delete("acme", a.id);
      await assert.rejects(restarted.get("acme", a.id), code(Status.NOT_FOUND));
      assert.equal(usageAgain.of("acme"), 12);
      if (kind === "bucket") assert.ok(![...s3.objects.keys()].some((k) => k.includes(a.id)), "both objects deleted");
      await restarted.delete("acme", b.id);
      await restarted.delete("other co", (await restarted.list("other co"))[0].id);
    });

    test(`${kind}: a snapshot over the quota is refused and leaves nothing behind`, async () => {
      const usage = new WorkspaceUsage();
      const snapshots = snapshotsOf(usage, 10);
      await assert.rejects(
        snapshots.create("acme", "s1", "", async (target, max) => {
          await writeFile(target, "x".repeat(max + 1));
          throw new (await import("../../services/sandbox/workspaces/workspace-archive.js")).ArchiveTooLarge("over");
        }),
        code(Status.RESOURCE_EXHAUSTED, /does not fit/),
      );
      assert.deepEqual(await snapshots.list("acme"), []);
      assert.equal(usage.of("acme"), 0);
      if (kind === "bucket") assert.equal(s3.objects.size, 0);
      const cache = await readdir(path.join(dataDir, kind === "bucket" ? "snapshot-cache" : "snapshots/acme")).catch(
        () => [],
      );
      assert.deepEqual(cache, [], "no staged archive left");
    });
  }

  for (const kind of ["directory", "bucket"] as const)
    test(`${kind}: what a crash left of a write (staged, or an archive without its record) goes at the next start`, async () => {
      const hoursAgo = new Date(Date.now() - 2 * 3_600_000);
      const folder = path.join(dataDir, "snapshots", "crashed");
      // Each a file of the directory store, or an object of the bucket under its prefix.
      const plant = async (name: string, old: boolean) => {
        if (kind === "bucket") {
          // Staged archives are local files of the bucket store's cache, trimmed there.
          if (name.endsWith(".partial")) return;
          const body = Buffer.from("x");
          s3.objects.set(`troupe/crashed/${name}`, {
            body,
            contentType: "application/octet-stream",
            etag: `"${createHash("md5").update(body).digest("hex")}"`,
            modified: old ? hoursAgo : new Date(),
          });
          return;
        }
        await mkdir(folder, { recursive: true });
        await writeFile(path.join(folder, name), "x");
        if (old) await utimes(path.join(folder, name), hoursAgo, hoursAgo);
      };
      const left = async () =>
        kind === "bucket"
          ? [...s3.objects.keys()].filter((k) => k.startsWith("troupe/crashed/")).map((k) => k.slice(15))
          : await readdir(folder);
      await plant("snap-a.tar.partial", true);
      await plant("snap-b.tar", true);
      await plant("snap-c.tar.partial", false);
      await plant("snap-d.tar", false);
      await plant("snap-e.tar", true);
      await plant("snap-e.json", true);
      const setting = kind === "bucket" ? `s3://snaps/troupe/?endpoint=${s3.endpoint}` : "";
      await new Snapshots(
        snapshotStoreOf(setting, { dataDir, logger }),
        new WorkspaceUsage(),
        () => 1 << 20,
        logger,
      ).ready();
      assert.deepEqual(
        (await left()).sort(),
        kind === "bucket"
          ? ["snap-d.tar", "snap-e.json", "snap-e.tar"]
          : ["snap-c.tar.partial", "snap-d.tar", "snap-e.json", "snap-e.tar"],
        "old leftovers went; a write that may be in flight, and a whole snapshot, stayed",
      );
      for (const k of [...s3.objects.keys()]) if (k.startsWith("troupe/crashed/")) s3.objects.delete(k);
      await rm(folder, { recursive: true, force: true });
    });

  test("bucket: a store that is down, or refuses the key, is UNAVAILABLE naming it; nothing is counted", async () => {
    const usage = new WorkspaceUsage();
    const snapshots = new Snapshots(
      snapshotStoreOf(`s3://snaps/down/?endpoint=${s3.endpoint}`, { dataDir, logger }),
      usage,
      () => 1 << 20,
      logger,
    );
    await s3.stop();
    try {
      await assert.rejects(
        snapshots.create("acme", "s1", "", async (t) => (await writeFile(t, "abc"), 3)),
        code(Status.UNAVAILABLE, /snapshot store s3:\/\/snaps\/down\/: listing snapshots failed/),
      );
    } finally {
      await s3.start();
    }
    const made = await snapshots.create("acme", "s1", "", async (t) => (await writeFile(t, "abc"), 3));
    assert.equal(usage.of("acme"), 3, "served once the store is back");

    // Bytes changed in the store are caught by the checksum on the way back, and not cached.
    const tar = `down/acme/${made.id}.tar`;
    s3.objects.get(tar)!.body = Buffer.from("abd");
    await rm(path.join(dataDir, "snapshot-cache"), { recursive: true, force: true });
    await assert.rejects(snapshots.archiveOf(made), code(Status.UNAVAILABLE, /reading an archive failed/));
    assert.deepEqual(await readdir(path.join(dataDir, "snapshot-cache")), []);
    await snapshots.delete("acme", made.id);

    process.env.AWS_SECRET_ACCESS_KEY = "not the secret";
    const refused = new Snapshots(
      snapshotStoreOf(`s3://snaps/?endpoint=${s3.endpoint}`, { dataDir, logger }),
      new WorkspaceUsage(),
      () => 1 << 20,
      logger,
    );
    await assert.rejects(refused.list("acme"), code(Status.UNAVAILABLE, /SignatureDoesNotMatch/));
    process.env.AWS_SECRET_ACCESS_KEY = KEYS.secretAccessKey;
    const noBucket = new Snapshots(
      snapshotStoreOf(`s3://no-such-bucket/?endpoint=${s3.endpoint}`, { dataDir, logger }),
      new WorkspaceUsage(),
      () => 1 << 20,
      logger,
    );
    await assert.rejects(noBucket.list("acme"), code(Status.UNAVAILABLE, /listing snapshots failed: NoSuchBucket/));
  });

  test("a setting that names no store is refused at start, saying what is known", () => {
    const ctx = { dataDir: "/tmp", logger };
    assert.throws(() => snapshotStoreOf("ftp://host/x", ctx), code(Status.INVALID_ARGUMENT, /known: file:, s3:/));
    assert.throws(() => snapshotStoreOf("s3:///prefix", ctx), code(Status.INVALID_ARGUMENT, /needs a bucket/));
    assert.throws(
      () => snapshotStoreOf("s3://b/?secret=x", ctx),
      code(Status.INVALID_ARGUMENT, /unknown parameter "secret"/),
    );
    assert.throws(
      () => snapshotStoreOf("relative/dir", ctx),
      code(Status.INVALID_ARGUMENT, /neither an absolute path/),
    );
    assert.equal(snapshotStoreOf("/srv/snaps", ctx).where, "/srv/snaps");
    assert.equal(snapshotStoreOf("s3://b/p", ctx).where, "s3://b/p/");
  });
});
