// A channel message's images, made ready for a vision model: the bytes an adapter sent, or the
// URL fetched through the SSRF guard (shared/net-guard.ts: public addresses only, checked ports,
// redirects checked hop by hop), at most MAX_IMAGE_BYTES in all and only PNG, JPEG, GIF or WebP by
// their first bytes. An image that fails any check is left out, with a log line: the message
// still goes in, and its text names the attachment as it did before images were sent.
import { create } from "@bufbuild/protobuf";
import { MediaKind, type MediaRef } from "../shared/gen/troupe/v1/inbound_pb.js";
import { ImageSchema, type Image } from "../shared/gen/troupe/v1/session_pb.js";
import { MAX_IMAGE_BYTES, MAX_IMAGES, sniffImage } from "../shared/images.js";
import type { Logger } from "../shared/log.js";
import { guardedRequest, type NetPolicy } from "../shared/net-guard.js";

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

async function imageOf(m: MediaRef, policy: NetPolicy): Promise<Image> {
  let data: Uint8Array = m.data;
  let stated = m.mimeType;
  if (data.length === 0) {
    const res = await guardedRequest(m.url, { maxBytes: MAX_IMAGE_BYTES, timeoutMs: FETCH_TIMEOUT_MS }, policy);
    if (res.status !== 200) throw new Error(`the URL answered ${res.status}`);
    if (res.truncated) throw new Error(`it is over ${MAX_IMAGE_BYTES} bytes`);
    const type = res.headers["content-type"];
    stated = (typeof type === "string" ? type : "").split(";")[0]!.trim().toLowerCase();
    data = res.body;
  }
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
