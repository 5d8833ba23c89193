// Image checks: a type is what the bytes say; frames with images that lie, too many or too large
// are INVALID_ARGUMENT.
import { test } from "node:test";
import assert from "node:assert/strict";
import { create } from "@bufbuild/protobuf";
import { MAX_IMAGE_BYTES, sniffImage, validateAttachments, validateImages } from "../../services/shared/media.js";
import { attachmentPath } from "../../services/gateway/media.js";
import { AttachmentSchema, ImageSchema } from "../../services/shared/gen/troupe/v1/session_pb.js";
import { Status, grpcCode } from "../../services/shared/errors.js";

const PNG = Buffer.from("89504e470d0a1a0a0000000d49484452", "hex");
const JPEG = Buffer.from("ffd8ffe000104a464946", "hex");
const GIF = Buffer.from("GIF89a\x01\x00\x01\x00", "latin1");
const WEBP = Buffer.from("RIFF\x24\x00\x00\x00WEBPVP8 ", "latin1");
const image = (mimeType: string, data: Buffer) => create(ImageSchema, { mimeType, data });
const refused = (f: () => void, why: RegExp) =>
  assert.throws(f, (e) => grpcCode(e) === Status.INVALID_ARGUMENT && why.test((e as Error).message));

test("each format is recognised by its signature, and nothing else is", () => {
  assert.equal(sniffImage(PNG), "image/png");
  assert.equal(sniffImage(JPEG), "image/jpeg");
  assert.equal(sniffImage(GIF), "image/gif");
  assert.equal(sniffImage(WEBP), "image/webp");
  for (const other of [
    Buffer.from("<html>"),
    Buffer.alloc(0),
    Buffer.from("RIFF\0\0\0\0WAVE", "latin1"),
    PNG.subarray(0, 7),
  ])
    assert.equal(sniffImage(other), undefined);
});

test("frames' images: the stated type must be the real one; at most 4, at most 2 MiB in all", () => {
  validateImages([image("image/png", PNG), image("image/webp", WEBP)]);
  refused(() => validateImages([image("image/png", JPEG)]), /images\[0\] is image\/jpeg, not image\/png/);
  refused(() => validateImages([image("image/png", Buffer.from("<svg/>"))]), /not a PNG, JPEG, GIF or WebP/);
  refused(() => validateImages(Array.from({ length: 5 }, () => image("image/png", PNG))), /at most 4/);
  const big = Buffer.concat([PNG, Buffer.alloc(MAX_IMAGE_BYTES)]);
  refused(() => validateImages([image("image/png", big)]), /2097152 bytes in all/);
});

test("attachments: only attachments/<name> paths, at most 10, at most 1 MiB in all", async () => {
  const { AttachmentSchema } = await import("../../services/shared/gen/troupe/v1/session_pb.js");
  const { validateAttachments } = await import("../../services/shared/media.js");
  const file = (path: string, size = 10) => create(AttachmentSchema, { path, data: Buffer.alloc(size), fileName: "f" });
  validateAttachments([file("attachments/ab12-1-data.csv")]);
  for (const path of [
    "../x",
    "attachments/../../etc/passwd",
    "attachments/a/b",
    "/workspace/x",
    "attachments/.hidden",
    "",
  ])
    refused(() => validateAttachments([file(path)]), /attachments\[0\]\.path/);
  refused(() => validateAttachments(Array.from({ length: 11 }, (_, i) => file(`attachments/f${i}`))), /at most 10/);
  refused(() => validateAttachments([file("attachments/big", 1024 * 1024 + 1)]), /1048576 bytes in all/);
});

const file = (path: string) => create(AttachmentSchema, { path, data: Buffer.alloc(10), fileName: "f" });

test("attachment paths: distinct frames never share one, every path is one validateAttachments takes", () => {
  // Two frame ids that end alike: an 8-character suffix of the id, the earlier prefix, put both
  // messages' voice.ogg at one path, the later overwriting the earlier in the owner's workspace.
  const a = attachmentPath("in:0123456789abcdef0123456789abcdef00c0ffee", 1, "voice.ogg");
  const b = attachmentPath("in:fedcba9876543210fedcba987654321000c0ffee", 1, "voice.ogg");
  assert.notEqual(a, b);
  assert.equal(
    attachmentPath("in:0123456789abcdef0123456789abcdef00c0ffee", 1, "voice.ogg"),
    a,
    "a redelivery lands where the first did",
  );
  assert.notEqual(
    attachmentPath("in:x", 1, "a b.txt"),
    attachmentPath("in:x", 2, "a_b.txt"),
    "files of one message differ by index",
  );
  const longest = attachmentPath("x".repeat(128), 10, `${"n".repeat(300)}.pdf`);
  const odd = attachmentPath("in:y", 3, "../../.ssh/id_rsa");
  assert.match(odd, /^attachments\/[0-9a-f]{32}-3-ssh_id_rsa$/);
  validateAttachments([file(longest), file(odd), file(attachmentPath("in:z", 1, ""))]);
});
