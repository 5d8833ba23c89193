// Media that comes with a message. Images for vision models: the four formats both OpenAI and Anthropic take (PNG, JPEG, GIF,
// WebP), recognised by their first bytes, since a stated type is only a claim. A message carries
// at most MAX_IMAGES of them and MAX_IMAGE_BYTES in all, so that it fits a gRPC message of the
// default 4 MiB with its text.
import { invalidArgument } from "./errors.js";
import type { Attachment, Image } from "./gen/troupe/v1/session_pb.js";

export const IMAGE_TYPES = ["image/png", "image/jpeg", "image/gif", "image/webp"] as const;
export const MAX_IMAGES = 4;
export const MAX_IMAGE_BYTES = 2 * 1024 * 1024;

/** The image type `data` is by its signature, or undefined when it is none of IMAGE_TYPES. */
export function sniffImage(data: Uint8Array): (typeof IMAGE_TYPES)[number] | undefined {
  const b = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  if (b.length >= 8 && b.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])))
    return "image/png";
  if (b.length >= 3 && b[0] === 0xff && b[1] === 0xd8 && b[2] === 0xff) return "image/jpeg";
  if (b.length >= 6 && /^GIF8[79]a$/.test(b.subarray(0, 6).toString("latin1"))) return "image/gif";
  if (
    b.length >= 12 &&
    b.subarray(0, 4).toString("latin1") === "RIFF" &&
    b.subarray(8, 12).toString("latin1") === "WEBP"
  )
    return "image/webp";
  return undefined;
}

/** Checks a frame's images: INVALID_ARGUMENT naming the first one that is not what it says, or too many, or too large. */
export function validateImages(images: readonly Image[]): void {
  if (images.length > MAX_IMAGES) throw invalidArgument(`at most ${MAX_IMAGES} images per message`);
  let total = 0;
  for (const [i, img] of images.entries()) {
    total += img.data.length;
    const actual = sniffImage(img.data);
    if (!actual) throw invalidArgument(`images[${i}] is not a PNG, JPEG, GIF or WebP image`);
    if (img.mimeType !== actual) throw invalidArgument(`images[${i}] is ${actual}, not ${img.mimeType || "unstated"}`);
  }
  if (total > MAX_IMAGE_BYTES)
    throw invalidArgument(`a message's images may hold ${MAX_IMAGE_BYTES} bytes in all, not ${total}`);
}

/** A message's files (Prompt.attachments): put in the session's workspace, under attachments/. */
export const MAX_ATTACHMENTS = 10;
export const MAX_ATTACHMENT_BYTES = 1024 * 1024;
/** The most bytes an adapter sends with a medium of this type: an image's, or a workspace file's. */
export const maxMediaBytes = (mimeType: string | undefined): number =>
  mimeType?.startsWith("image/") ? MAX_IMAGE_BYTES : MAX_ATTACHMENT_BYTES;

const ATTACHMENT_PATH = /^attachments\/[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

export function validateAttachments(files: readonly Attachment[]): void {
  if (files.length > MAX_ATTACHMENTS) throw invalidArgument(`at most ${MAX_ATTACHMENTS} attachments per message`);
  let total = 0;
  for (const [i, f] of files.entries()) {
    total += f.data.length;
    if (!ATTACHMENT_PATH.test(f.path) || f.path.includes(".."))
      throw invalidArgument(`attachments[${i}].path must be attachments/<name> of A-Z a-z 0-9 . _ -`);
  }
  if (total > MAX_ATTACHMENT_BYTES)
    throw invalidArgument(`a message's attachments may hold ${MAX_ATTACHMENT_BYTES} bytes in all, not ${total}`);
}
