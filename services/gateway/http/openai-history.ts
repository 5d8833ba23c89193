// A Chat Completions request's messages as Troupe's: the conversation before the last user
// message (for a session made from it, OpenSession.history), the system and developer messages
// (the run's instruction, below the agent's own prompt), and the last user message with its
// images. Shapes: https://platform.openai.com/docs/api-reference/chat/create (messages, content
// parts, tool_calls). Images come as data URLs or http(s) URLs, fetched through the SSRF guard.
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import {
  type ChatMessageSchema,
  type Image,
  ImageSchema,
  Role,
  type ChatMessage,
} from "../../shared/gen/troupe/v1/session_pb.js";
import { MAX_IMAGE_BYTES, MAX_IMAGES, sniffImage } from "../../shared/media.js";
import { guardedRequest, type NetPolicy } from "../../shared/net/net-guard.js";
import { ApiError } from "./openai-request.js";

type HistoryMessage = MessageInitShape<typeof ChatMessageSchema>;

export interface Conversation {
  /** Every message before the last user message, as the session's history. */
  earlier: HistoryMessage[];
  /** The system and developer messages, in order: the run's instruction. */
  instruction: string;
  /** The last user message. */
  prompt: { text: string; images: Image[] };
}

const bad = (message: string) => new ApiError(400, message, undefined, null, "messages");

interface Part {
  type?: unknown;
  text?: unknown;
  image_url?: { url?: unknown } | string;
}

/** A message's content as text and image URLs; `where` names it in errors. */
function contentOf(content: unknown, where: string, images: boolean): { text: string; urls: string[] } {
  if (content === null || content === undefined) return { text: "", urls: [] };
  if (typeof content === "string") return { text: content, urls: [] };
  if (!Array.isArray(content)) throw bad(`${where}: content must be a string or an array of parts`);
  const text: string[] = [];
  const urls: string[] = [];
  for (const p of content as Part[]) {
    if (p?.type === "text" && typeof p.text === "string") text.push(p.text);
    else if (p?.type === "image_url" && images) {
      const url = typeof p.image_url === "string" ? p.image_url : p.image_url?.url;
      if (typeof url !== "string") throw bad(`${where}: an image_url part needs its url`);
      urls.push(url);
    } else
      throw bad(`${where}: content parts must be text${images ? " or image_url" : ""}, not ${JSON.stringify(p?.type)}`);
  }
  return { text: text.join("\n"), urls };
}

/** The messages of a request, checked. The last must be the user's. */
export function conversationOf(messages: unknown): {
  earlier: HistoryMessage[];
  instruction: string;
  last: { text: string; urls: string[] };
} {
  if (!Array.isArray(messages) || messages.length === 0) throw bad("`messages` must be a non-empty array");
  const earlier: HistoryMessage[] = [];
  const instructions: string[] = [];
  let last: { text: string; urls: string[] } | undefined;
  for (const [i, raw] of (messages as Record<string, unknown>[]).entries()) {
    const where = `messages[${i}]`;
    const role = raw?.role;
    const isLast = i === messages.length - 1;
    if (role === "system" || role === "developer") {
      if (isLast) throw bad("the last message must be the user's");
      const { text } = contentOf(raw.content, where, false);
      if (text.trim() !== "") instructions.push(text);
    } else if (role === "user") {
      const c = contentOf(raw.content, where, true);
      if (isLast) last = c;
      else if (c.urls.length > 0)
        // Earlier images are not fetched again: the message keeps its text, and says so.
        earlier.push({
          role: Role.USER,
          text: `${c.text}${c.text ? "\n" : ""}[${c.urls.length} image(s) sent earlier]`,
        });
      else if (c.text.trim() !== "") earlier.push({ role: Role.USER, text: c.text });
    } else if (role === "assistant") {
      if (isLast) throw bad("the last message must be the user's");
      const { text } = contentOf(raw.content, where, false);
      const calls = Array.isArray(raw.tool_calls) ? (raw.tool_calls as Record<string, unknown>[]) : [];
      const toolCalls = calls.map((c, k) => {
        const fn = c?.function as { name?: unknown; arguments?: unknown } | undefined;
        if (typeof c?.id !== "string" || typeof fn?.name !== "string")
          throw bad(`${where}.tool_calls[${k}]: needs an id and a function name`);
        return { id: c.id, name: fn.name, argumentsJson: typeof fn.arguments === "string" ? fn.arguments : "{}" };
      });
      if (text.trim() !== "" || toolCalls.length > 0) earlier.push({ role: Role.ASSISTANT, text, toolCalls });
    } else if (role === "tool") {
      if (isLast) throw bad("the last message must be the user's");
      if (typeof raw.tool_call_id !== "string") throw bad(`${where}: a tool message needs its tool_call_id`);
      const { text } = contentOf(raw.content, where, false);
      earlier.push({ role: Role.TOOL, toolCallId: raw.tool_call_id, text });
    } else throw bad(`${where}: role must be system, developer, user, assistant or tool`);
  }
  if (!last) throw bad("the last message must be the user's");
  if (last.text.trim() === "" && last.urls.length === 0) throw bad("the last user message has no text");
  return { earlier, instruction: instructions.join("\n\n"), last };
}

/** An image_url's bytes: a data URL's, or an http(s) URL's fetched through the guard. */
async function imageAt(url: string, policy: NetPolicy): Promise<Image> {
  let data: Uint8Array;
  const inline = /^data:([\w/+.-]+);base64,(.*)$/s.exec(url);
  if (inline) {
    data = Buffer.from(inline[2], "base64");
    if (data.length > MAX_IMAGE_BYTES) throw bad(`an image is over ${MAX_IMAGE_BYTES} bytes`);
  } else if (/^https?:\/\//i.test(url)) {
    let res: Awaited<ReturnType<typeof guardedRequest>>;
    try {
      res = await guardedRequest(url, { maxBytes: MAX_IMAGE_BYTES, timeoutMs: 10_000 }, policy);
    } catch (err) {
      throw bad(`the image at ${url.slice(0, 200)} cannot be fetched: ${(err as Error).message}`);
    }
    if (res.status !== 200) throw bad(`the image at ${url.slice(0, 200)} answered ${res.status}`);
    if (res.truncated) throw bad(`the image at ${url.slice(0, 200)} is over ${MAX_IMAGE_BYTES} bytes`);
    data = res.body;
  } else throw bad("an image_url must be a data: URL or an http(s) URL");
  const actual = sniffImage(data);
  if (!actual) throw bad("an image is not a PNG, JPEG, GIF or WebP image");
  // The type is the bytes' own (a data URL's or a server's stated type may be wrong).
  return create(ImageSchema, { mimeType: actual, data, sourceUrl: inline ? "" : url, sizeBytes: BigInt(data.length) });
}

/** The request's conversation with the last message's images fetched. */
export async function requestConversation(messages: unknown, policy: NetPolicy): Promise<Conversation> {
  const { earlier, instruction, last } = conversationOf(messages);
  if (last.urls.length > MAX_IMAGES) throw bad(`at most ${MAX_IMAGES} images per message`);
  const images = await Promise.all(last.urls.map((u) => imageAt(u, policy)));
  return { earlier, instruction, prompt: { text: last.text.trim() === "" ? "(image)" : last.text, images } };
}

/**
 * Whether the request's earlier user and assistant messages are the session's latest ones, in
 * order (a client may send fewer than the session holds, never different ones). Tool messages
 * and tool calls are the session's own business and not compared.
 */
export function sameConversation(
  request: readonly HistoryMessage[],
  session: readonly ChatMessage[],
): string | undefined {
  const said = (m: { role?: Role; text?: string }) =>
    (m.role === Role.USER || m.role === Role.ASSISTANT) && (m.text ?? "").trim() !== "";
  const mine = request.filter(said);
  const held = session.filter(said);
  if (mine.length > held.length)
    return `the request carries ${mine.length} earlier messages; the session holds ${held.length}`;
  const tail = held.slice(held.length - mine.length);
  for (const [i, m] of mine.entries()) {
    const h = tail[i];
    if (h.role !== m.role || h.text.trim() !== (m.text ?? "").trim())
      return `earlier message ${i + 1} (${m.role === Role.USER ? "user" : "assistant"}) is not the session's: it holds ${JSON.stringify(h.text.slice(0, 80))}`;
  }
  return undefined;
}
