// Images from channel messages reach vision models as image parts, checked by servers written
// from each provider's reference (helpers/openai-api.ts, helpers/anthropic-api.ts): an image URL
// fetched by the gateway through the SSRF guard, or bytes an adapter sent; a model without vision
// gets the text line alone; an image that lies about its type, is too large, or lives at an
// address the guard refuses is left out while the message still goes in.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import http from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { Role } from "../services/shared/gen/troupe/v1/session_pb.js";
import { AnthropicApiServer, type AnthropicBody } from "./helpers/anthropic-api.js";
import { ChatApiServer, type ChatBody } from "./helpers/openai-api.js";
import { startStack, waitFor, writeAgent, type Stack } from "./helpers/stack.js";

const KEY = "sk-test-media";
/** A real 1x1 PNG. */
const PNG = Buffer.from(
  "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==",
  "base64",
);
let stack: Stack;
let dataDir: string;
let openai: ChatApiServer;
let anthropic: AnthropicApiServer;
let images: http.Server;
let imageBase: string;
let port: number;
const fetched: string[] = [];
let adapter: Awaited<ReturnType<Stack["gatewayAs"]>>;
let n = 0;

before(async () => {
  openai = await new ChatApiServer({
    flavour: "openai",
    apiKey: KEY,
    models: [{ id: "gpt-4o-mini" }, { id: "gpt-3.5-turbo", vision: false }],
    // A message naming a workspace file is answered by reading it; then with "read".
    reply: (body) => {
      const lastMsg = body.messages.at(-1)!;
      if (lastMsg.role === "tool") return { text: "read" };
      const placed = /is in the workspace at \/workspace\/(attachments\/\S+)\]/.exec(JSON.stringify(lastMsg.content));
      return placed ? { toolCalls: [{ name: "read_file", arguments: { path: placed[1]! } }] } : { text: "ok" };
    },
  }).start();
  anthropic = await new AnthropicApiServer({ apiKey: KEY }).start();
  images = http.createServer((req, res) => {
    fetched.push(`${req.socket.localAddress} ${req.url}`);
    if (req.url === "/cat.png") res.writeHead(200, { "content-type": "image/png" }).end(PNG);
    else if (req.url === "/lie.png")
      res.writeHead(200, { "content-type": "image/png" }).end("<html>not an image</html>");
    else if (req.url === "/huge.png")
      res.writeHead(200, { "content-type": "image/png" }).end(Buffer.concat([PNG, Buffer.alloc(3 * 1024 * 1024)]));
    else if (req.url === "/data.csv") res.writeHead(200, { "content-type": "text/csv" }).end("city,bees\nLyon,12\n");
    else if (req.url === "/away.png") res.writeHead(302, { location: `http://127.0.0.2:${port}/cat.png` }).end();
    else res.writeHead(404).end();
  });
  // On every loopback address: 127.0.0.2 would answer too, were the guard not in the way.
  await new Promise<void>((r) => images.listen(0, "0.0.0.0", () => r()));
  port = (images.address() as AddressInfo).port;
  imageBase = `http://127.0.0.1:${port}`;

  dataDir = await mkdtemp(path.join(os.tmpdir(), "troupe-media-"));
  const providersFile = path.join(dataDir, "providers.json");
  await writeFile(
    providersFile,
    JSON.stringify({
      providers: {
        openai: { kind: "openai", baseUrl: openai.baseUrl, apiKey: { env: "TROUPE_TEST_PROVIDER_KEY" } },
        claude: { kind: "anthropic", baseUrl: anthropic.baseUrl, apiKey: { env: "TROUPE_TEST_PROVIDER_KEY" } },
      },
      default: "openai",
    }),
  );
  for (const [id, model] of [
    ["main", "openai/gpt-4o-mini"],
    ["blind", "openai/gpt-3.5-turbo"],
    ["claude", "claude/claude-sonnet-4-6"],
  ]) {
    await writeAgent(dataDir, id!, { model });
  }
  await writeFile(
    path.join(dataDir, "routing.json"),
    JSON.stringify({
      bindings: [
        { agent: "blind", match: { channel: "blindchat" } },
        { agent: "claude", match: { channel: "claudechat" } },
      ],
      session: { dmScope: "per-channel-peer" },
    }),
  );
  stack = await startStack({
    dataDir,
    services: ["router", "memory", "sandbox", "runner", "gateway"],
    env: {
      TROUPE_PROVIDERS_FILE: providersFile,
      TROUPE_TEST_PROVIDER_KEY: KEY,
      TROUPE_MODEL: "openai/gpt-4o-mini",
      TROUPE_MEMORY_LEARN: "0",
      // The image server is on loopback: the operator lets the guard reach it, and its port.
      TROUPE_NET_ALLOW: "127.0.0.1/32",
      TROUPE_NET_PORTS: `80,443,${port}`,
    },
  });
  adapter = await stack.gatewayAs(
    "local",
    "bot",
    {},
    { role: "adapter", channels: ["web", "blindchat", "claudechat"] },
  );
});
after(async () => {
  adapter?.close();
  await stack?.stop();
  images?.close();
  await Promise.all([openai?.close(), anthropic?.close()]);
  if (dataDir) await rm(dataDir, { recursive: true, force: true });
});

/** Delivers a message with media from a new sender; resolves with the model request that answered it. */
async function send<B>(
  channel: string,
  media: object[],
  accepted: () => B[],
  text = "what is in this picture?",
): Promise<{ body: B; sessionId: string }> {
  const sender = `s${++n}`;
  const before = accepted().length;
  const res = await adapter.deliver({
    message: { idempotencyKey: `k${n}`, context: { channel, sender: { id: sender } }, text, media },
  });
  const body = await waitFor(
    `the model request for ${sender}`,
    async () => accepted().length > before && accepted()[before],
    30_000,
  );
  return { body: body as B, sessionId: res.sessionId };
}
const userParts = (b: ChatBody) => b.messages.filter((m) => m.role === "user").at(-1)!.content;

test("an image URL reaches a vision model as an image_url part holding its bytes", async () => {
  const { body, sessionId } = await send(
    "web",
    [{ url: `${imageBase}/cat.png`, mimeType: "image/png" }],
    () => openai.accepted,
  );
  const parts = userParts(body) as { type: string; text?: string; image_url?: { url: string } }[];
  assert.ok(Array.isArray(parts), "content parts, not a string");
  assert.equal(parts[0]!.type, "text");
  assert.match(parts[0]!.text!, /what is in this picture\?/);
  const image = parts.find((p) => p.type === "image_url")!;
  assert.equal(image.image_url!.url, `data:image/png;base64,${PNG.toString("base64")}`);
  assert.deepEqual(openai.refused, []);
  // The history records the image without its bytes.
  const h = (await adapter.getHistory({ sessionId })).messages.find((m) => m.role === Role.USER)!;
  assert.equal(h.images.length, 1);
  assert.equal(h.images[0]!.mimeType, "image/png");
  assert.equal(Number(h.images[0]!.sizeBytes), PNG.length);
  assert.equal(h.images[0]!.data.length, 0);
});

test("bytes an adapter sent are used as they are, never fetched", async () => {
  const before = fetched.length;
  const { body } = await send(
    "web",
    [{ url: "telegram:file/AgAD123", mimeType: "image/png", data: PNG }],
    () => openai.accepted,
  );
  const parts = userParts(body) as { type: string; image_url?: { url: string } }[];
  assert.equal(parts.filter((p) => p.type === "image_url").length, 1);
  assert.equal(fetched.length, before);
});

test("a model without vision gets the text line and no image part, and accepts the request", async () => {
  const { body } = await send(
    "blindchat",
    [{ url: `${imageBase}/cat.png`, mimeType: "image/png" }],
    () => openai.accepted,
  );
  assert.equal(body.model, "gpt-3.5-turbo");
  const content = userParts(body);
  assert.equal(typeof content, "string");
  assert.match(content as string, /\[image: cat\.png \(image\/png\)\]/);
  assert.deepEqual(openai.refused, []);
});

test("Claude gets a base64 image block before the text", async () => {
  const { body } = await send(
    "claudechat",
    [{ url: `${imageBase}/cat.png`, mimeType: "image/png" }],
    () => anthropic.accepted,
  );
  const blocks = (body as AnthropicBody).messages.at(-1)!.content as {
    type: string;
    source?: Record<string, string>;
  }[];
  assert.equal(blocks[0]!.type, "image");
  assert.deepEqual(blocks[0]!.source, { type: "base64", media_type: "image/png", data: PNG.toString("base64") });
  assert.equal(blocks.at(-1)!.type, "text");
  assert.deepEqual(anthropic.refused, []);
});

test("an image that lies, is too large, or is behind the guard is left out; the message still goes in", async () => {
  const guarded = `http://127.0.0.2:${port}/cat.png`;
  for (const url of [`${imageBase}/lie.png`, `${imageBase}/huge.png`, `${imageBase}/away.png`, guarded]) {
    const { body } = await send("web", [{ url, mimeType: "image/png" }], () => openai.accepted, `about ${url}`);
    const content = userParts(body);
    assert.equal(typeof content, "string", url);
    assert.match(content as string, /\[image: /, url);
  }
  assert.ok(!fetched.some((u) => u.startsWith("127.0.0.2")), "nothing was asked of an address the guard refuses");
  assert.deepEqual(openai.refused, []);
});

test("other files go into the session's workspace, where the agent reads them; the message says where", async () => {
  const before = openai.accepted.length;
  const res = await adapter.deliver({
    message: {
      idempotencyKey: `k${++n}`,
      context: { channel: "web", sender: { id: `s${n}` } },
      text: "what does the table say?",
      media: [
        { url: `${imageBase}/data.csv`, mimeType: "text/csv", fileName: "data.csv" },
        {
          url: "notes:1",
          mimeType: "text/plain",
          fileName: "../../etc/notes.txt",
          data: Buffer.from("sent by the adapter"),
        },
      ],
    },
  });
  const done = await waitFor(
    "the answer after reading the file",
    async () => openai.accepted.slice(before).find((b) => b.messages.at(-1)!.role === "tool"),
    60_000,
  );
  const tool = done.messages.at(-1)!;
  assert.match(String(tool.content), /city,bees\nLyon,12/, "the file the model read is the one sent");
  const user = done.messages.filter((m) => m.role === "user").at(-1)!;
  assert.match(String(user.content), /\[data\.csv is in the workspace at \/workspace\/attachments\/\w+-1-data\.csv\]/);
  // A name that tries to leave the workspace is only a name.
  assert.match(String(user.content), /\/workspace\/attachments\/\w+-2-etc_notes\.txt\]/);
  assert.ok(res.sessionId);
});
