// A channel message's media, made ready for the run: the bytes an adapter sent, or the URL
// fetched through the SSRF guard (shared/net/net-guard.ts: public addresses only, checked ports,
// redirects checked hop by hop). Images for a vision model: at most MAX_IMAGE_BYTES in all and
// only PNG, JPEG, GIF or WebP by their first bytes. Other files for the session's workspace: at
// most MAX_ATTACHMENT_BYTES in all. What fails a check is left out, with a log line (and, for a
// file, a line telling the model): the message still goes in, its text naming the attachment.
import { createHash } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import { MediaKind, type MediaRef } from "../shared/gen/troupe/v1/inbound_pb.js";
import { AttachmentSchema, ImageSchema, type Attachment, type Image } from "../shared/gen/troupe/v1/session_pb.js";
import { MAX_ATTACHMENT_BYTES, MAX_ATTACHMENTS, MAX_IMAGE_BYTES, MAX_IMAGES, sniffImage } from "../shared/media.js";
import type { Logger } from "../shared/process/log.js";
import { guardedRequest, type NetPolicy } from "../shared/net/net-guard.js";

const FETCH_TIMEOUT_MS = 10_000;

export async function imagesOf(media: readonly MediaRef[], policy: NetPolicy, logger: Logger): Promise<Image[]> {
  const wanted = media.filter((m) => m.kind === MediaKind.IMAGE).slice(0, MAX_IMAGES);
  const got = await Promise.all(
    wanted.map(async (m) => {
      try {
        return await imageOf(m, policy);
      } catch (err) {
        logger.info("an image was left out of a message", {
          url: m.url.slice(0, 200),
          reason: String((err as Error).message),
        });
        return undefined;
      }
    }),
  );
  const out: Image[] = [];
  let total = 0;
  for (const image of got) {
    if (!image) continue;
    if (total + image.data.length > MAX_IMAGE_BYTES) {
      logger.info("an image was left out of a message", {
        reason: `the message's images passed ${MAX_IMAGE_BYTES} bytes`,
      });
      continue;
    }
    total += image.data.length;
    out.push(image);
  }
  return out;
}

/** The media's bytes and the type they were served as: the adapter's, or fetched through the guard. */
async function bytesOf(
  m: MediaRef,
  policy: NetPolicy,
  maxBytes: number,
): Promise<{ data: Uint8Array; stated: string }> {
  if (m.data.length > 0) return { data: m.data, stated: m.mimeType };
  const res = await guardedRequest(m.url, { maxBytes, timeoutMs: FETCH_TIMEOUT_MS }, policy);
  if (res.status !== 200) throw new Error(`the URL answered ${res.status}`);
  if (res.truncated) throw new Error(`it is over ${maxBytes} bytes`);
  const type = res.headers["content-type"];
  return { data: res.body, stated: (typeof type === "string" ? type : "").split(";")[0]!.trim().toLowerCase() };
}

async function imageOf(m: MediaRef, policy: NetPolicy): Promise<Image> {
  const { data, stated } = await bytesOf(m, policy, MAX_IMAGE_BYTES);
  const actual = sniffImage(data);
  if (!actual) throw new Error("it is not a PNG, JPEG, GIF or WebP image");
  if (stated !== actual) throw new Error(`it is ${actual}, served as ${stated || "no type"}`);
  return create(ImageSchema, {
    mimeType: actual,
    data,
    sourceUrl: m.url,
    sizeBytes: BigInt(data.length),
  });
}

/**
 * Where a message's `index`th file goes in the workspace: attachments/<frame>-<index>-<name>.
 * <frame> is 128 bits of a SHA-256 of the frame id, so two messages' files never share a path
 * (the workspace is the owner's, across sessions and channels); <name> is the sender's file name
 * made safe, for the model to read. At most 128 characters after attachments/ (validateAttachments).
 */
export function attachmentPath(frameId: string, index: number, fileName: string): string {
  const frame = createHash("sha256").update(frameId).digest("hex").slice(0, 32);
  const name =
    fileName
      .replace(/[^A-Za-z0-9._-]/g, "_")
      .replace(/^[._-]+/, "")
      .slice(0, 90) || `file-${index}`;
  return `attachments/${frame}-${index}-${name}`;
}

/**
 * A message's other media as files for the workspace (attachmentPath), and the lines that tell
 * the model where each is, or why it is not there.
 */
export async function attachmentsOf(
  media: readonly MediaRef[],
  frameId: string,
  policy: NetPolicy,
  logger: Logger,
): Promise<{ attachments: Attachment[]; lines: string[] }> {
  const files = media.filter((m) => m.kind !== MediaKind.IMAGE).slice(0, MAX_ATTACHMENTS);
  const attachments: Attachment[] = [];
  const lines: string[] = [];
  let total = 0;
  for (const [i, m] of files.entries()) {
    const path = attachmentPath(frameId, i + 1, m.fileName);
    try {
      const room = MAX_ATTACHMENT_BYTES - total;
      const { data } = await bytesOf(m, policy, room);
      if (data.length > room) throw new Error(`the message's files passed ${MAX_ATTACHMENT_BYTES} bytes`);
      total += data.length;
      attachments.push(create(AttachmentSchema, { fileName: m.fileName, mimeType: m.mimeType, data, path }));
      lines.push(`[${m.fileName} is in the workspace at /workspace/${path}]`);
    } catch (err) {
      logger.info("a file was not put in the workspace", {
        url: m.url.slice(0, 200),
        reason: String((err as Error).message),
      });
      lines.push(`[${m.fileName} could not be put in the workspace: ${(err as Error).message}]`);
    }
  }
  return { attachments, lines };
}
