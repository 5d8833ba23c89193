// Normalising what channel adapters deliver, before it is routed: one shape of text, a chat type
// that is always set, typed media, the body the agent sees, and a frame id that makes a
// redelivered message a duplicate. Anything that cannot be made sense of is INVALID_ARGUMENT.
import { createHash } from "node:crypto";
import { NAME } from "../shared/auth/api-keys.js";
import { create } from "@bufbuild/protobuf";
import { invalidArgument, invalidArgumentIf } from "../shared/errors.js";
import { CHANNEL_NAME } from "../shared/ids.js";
import { inboundFrameId } from "../shared/frames.js";
import { MAX_IMAGE_BYTES } from "../shared/media.js";
import {
  ChannelContextSchema,
  ChatType,
  MediaKind,
  MediaRefSchema,
  type ChannelContext,
  type InboundMessage,
  type MediaRef,
} from "../shared/gen/troupe/v1/inbound_pb.js";

const MAX_MEDIA = 32;
const MAX_TEXT_CHARS = 32_000;

export interface NormalisedInbound {
  context: ChannelContext;
  /** The text the agent sees: the message, else what its media say, plus a line per attachment. */
  body: string;
  media: MediaRef[];
  /** The session frame id: the same idempotency key always gives the same id. */
  frameId: string;
  commandAuthorized: boolean;
}

/** One kind of line break, no control characters but tab and newline, no trailing blanks. */
export function normaliseText(text: string): string {
  return text
    .replace(/\r\n?/g, "\n")
    .replace(/[\u0000-\u0008\u000b-\u001f\u007f]/g, "")
    .replace(/[ \t]+$/gm, "")
    .trim();
}

function mediaKind(mime: string): MediaKind {
  const top = mime.split("/")[0];
  return top === "image"
    ? MediaKind.IMAGE
    : top === "audio"
      ? MediaKind.AUDIO
      : top === "video"
        ? MediaKind.VIDEO
        : MediaKind.FILE;
}

const KIND_NAME: Record<MediaKind, string> = {
  [MediaKind.UNSPECIFIED]: "file",
  [MediaKind.IMAGE]: "image",
  [MediaKind.AUDIO]: "audio",
  [MediaKind.VIDEO]: "video",
  [MediaKind.FILE]: "file",
};

/** The last path segment of a media URL, decoded; "" when the URL or its escapes do not parse. */
function fileNameOf(url: string): string {
  try {
    return decodeURIComponent(new URL(url, "http://x/").pathname.split("/").pop() ?? "");
  } catch {
    return "";
  }
}

function normaliseMedia(m: MediaRef, i: number): MediaRef {
  invalidArgumentIf(m.url === "" || m.url.length > 2048, `media[${i}].url must be 1-2048 characters`);
  invalidArgumentIf(m.data.length > MAX_IMAGE_BYTES, `media[${i}].data is over ${MAX_IMAGE_BYTES} bytes`);
  const mime = (m.mimeType || "application/octet-stream").toLowerCase().trim();
  invalidArgumentIf(
    !/^[a-z0-9.+-]+\/[a-z0-9.+-]+$/.test(mime),
    `media[${i}].mime_type ${JSON.stringify(mime.slice(0, 64))} is not a MIME type`,
  );
  const fromUrl = fileNameOf(m.url);
  return create(MediaRefSchema, {
    url: m.url,
    mimeType: mime,
    kind: m.kind === MediaKind.UNSPECIFIED ? mediaKind(mime) : m.kind,
    sizeBytes: m.sizeBytes,
    fileName: normaliseText(m.fileName || fromUrl || `attachment-${i + 1}`).slice(0, 255),
    caption: normaliseText(m.caption),
    transcript: normaliseText(m.transcript),
    data: m.data,
  });
}

const describe = (m: MediaRef) =>
  `[${KIND_NAME[m.kind]}: ${m.fileName} (${m.mimeType}${m.sizeBytes > 0n ? `, ${m.sizeBytes} bytes` : ""})]`;

export function normaliseInbound(msg: InboundMessage | undefined): NormalisedInbound {
  if (!msg) throw invalidArgument("message is required");
  const key = msg.idempotencyKey;
  invalidArgumentIf(
    key === "" || key.length > 256 || /[\u0000-\u001f]/.test(key),
    "message.idempotency_key must be 1-256 characters without control characters",
  );
  const c = msg.context;
  if (!c) throw invalidArgument("message.context is required");
  const channel = c.channel.trim().toLowerCase();
  invalidArgumentIf(!CHANNEL_NAME.test(channel), "message.context.channel must be 1-32 of a-z 0-9 _ -");
  invalidArgumentIf(!c.sender?.id, "message.context.sender.id is required");
  // A chat type not given is inferred: a chat that is the sender (or none) is direct.
  const chatType =
    c.chatType !== ChatType.UNSPECIFIED
      ? c.chatType
      : !c.peer?.id || c.peer.id === c.sender!.id
        ? ChatType.DIRECT
        : ChatType.GROUP;
  invalidArgumentIf(
    chatType !== ChatType.DIRECT && !c.peer?.id,
    "message.context.peer.id is required for group and channel chats",
  );
  const context = create(ChannelContextSchema, {
    ...c,
    channel,
    chatType,
    peer: c.peer?.id ? c.peer : c.sender,
    roles: [...new Set(c.roles.map((r) => r.trim()).filter((r) => r !== ""))],
  });

  invalidArgumentIf(msg.media.length > MAX_MEDIA, `at most ${MAX_MEDIA} media per message`);
  const media = msg.media.map(normaliseMedia);
  const text = normaliseText(msg.text);
  invalidArgumentIf(text.length > MAX_TEXT_CHARS, `message.text is over ${MAX_TEXT_CHARS} characters`);
  // The body's priority chain: the text, else a transcript, else a caption, else the attachments.
  const lead = text || media.find((m) => m.transcript)?.transcript || media.find((m) => m.caption)?.caption || "";
  // An audio's transcript is its words: it goes in, unless it is the lead already.
  const lines = media.map((m) =>
    m.transcript && m.transcript !== lead ? `${describe(m)} transcript: ${m.transcript}` : describe(m),
  );
  const body = [lead, ...lines].filter((l) => l !== "").join("\n");
  invalidArgumentIf(body === "", "the message has neither text nor media");

  const frameId = inboundFrameId(channel, c.accountId, key);
  return { context, body, media, frameId, commandAuthorized: msg.commandAuthorized };
}

/**
 * A canonical sender as a memory owner: as it is when it fits the memory service's alphabet, else
 * a hash of it under a prefix no channel name can have (channel names have no '.'). An unlinked
 * sender is "channel:id" and principals have no ':', so a sender is never a principal's memory
 * owner unless routing's identityLinks say so.
 */
export function memoryOwnerOf(sender: string): string {
  return NAME.test(sender) ? sender : `hashed.sender:${createHash("sha256").update(sender).digest("hex")}`;
}

/**
 * A display name as the history's label shows it ("[time] name: text"): one line, no control
 * characters, no ':' or brackets (so no name can forge another label), at most 64 characters.
 */
export function labelName(name: string): string {
  return name
    .replace(/[\p{Cc}\p{Cf}\u2028\u2029[\]:]/gu, " ")
    .replace(/\s+/g, " ")
    .trim()
    .slice(0, 64);
}
