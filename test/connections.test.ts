// Clients leaving must not hurt the clients that stay. Every client's stream reaches its runner
// over one shared gateway -> runner connection, and HTTP/2 servers close a connection that resets
// streams too fast (nghttp2: a burst of about 1,000). So the gateway leaves a runner's stream with
// a detach message and a half-close, never a reset; this test makes 2,400 clients leave abruptly
// while another session streams on.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { GatewayService } from "../services/shared/gen/troupe/v1/gateway_pb.js";
import { Role, StopReason } from "../services/shared/gen/troupe/v1/session_pb.js";
import { createClient } from "../services/shared/rpc.js";
import { ChatSession } from "./helpers/session.js";
import { startStack, type Stack } from "./helpers/stack.js";

let stack: Stack;
before(async () => {
  stack = await startStack({
    services: ["model-server", "router", "runner", "gateway"],
    env: { TROUPE_MEMORY_CONTEXT_K: "0" },
  });
});
after(async () => {
  await stack?.stop();
});

test("2,400 clients cancelling their streams leave a long-running session on the same runner untouched", async () => {
  const stayer = new ChatSession(stack.gateway);
  stayer.open("conn-stay");
  await stayer.waitOpened();
  stayer.prompt("!tokens 3000 rate=300");
  await stayer.waitForPayload("messageUpdate");

  // Each client has its own connection to the gateway (a real client would), and cancels its
  // stream once it is open: a reset on its own connection, which the gateway must not pass on.
  const clients = Array.from({ length: 4 }, () =>
    createClient(GatewayService, stack.addr.gateway, {
      ownConnection: true,
      headers: { authorization: `Bearer ${stack.apiKey}` },
    }),
  );
  try {
    const leave = async (client: (typeof clients)[number]) => {
      for (let i = 0; i < 75; i++) {
        const s = new ChatSession(client);
        s.open("conn-shared", true);
        await s.waitOpened();
        s.close();
      }
    };
    const started = Date.now();
    await Promise.all(clients.flatMap((c) => Array.from({ length: 8 }, () => leave(c))));
    // The guard refills at 33 resets/s: the leaving must outpace it for this test to mean anything.
    assert.ok(Date.now() - started < 20_000, `2,400 clients took ${Date.now() - started} ms to leave`);
  } finally {
    for (const c of clients) c.close();
  }

  const end = await stayer.waitForPayload("agentEnd", 30_000);
  assert.equal(stayer.status, undefined, `the staying stream ended early: ${stayer.status?.details}`);
  assert.equal(end.payload.case === "agentEnd" && end.payload.value.stopReason, StopReason.COMPLETED);
  const reply = stayer.events.find(
    (e) => e.payload.case === "messageEnd" && e.payload.value.message?.role === Role.ASSISTANT,
  );
  const streamed = stayer.events
    .map((e) =>
      e.payload.case === "messageUpdate" && e.payload.value.delta.case === "text" ? e.payload.value.delta.value : "",
    )
    .join("");
  assert.ok(reply && reply.payload.case === "messageEnd" && reply.payload.value.message!.text.length > 3000);
  assert.equal(streamed, reply.payload.value.message!.text, "every token arrived, in order");

  // And the runner still takes new streams on that connection.
  const later = new ChatSession(stack.gateway);
  later.open("conn-later");
  await later.waitOpened();
  later.prompt("still serving?");
  await later.waitForPayload("agentEnd");
  later.close();
});
