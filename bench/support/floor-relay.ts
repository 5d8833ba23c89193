// bench/stream-floor's relays: the least any runner and gateway must do per token, in their own
// processes, so that the floor of the paced load's path can be measured on this machine.
//
//   node floor-relay.js runner MODEL_ORIGIN   a gRPC server: each stream's first message is a
//       prompt; it streams a chat completion for it from the model server (undici, one
//       connection per reply, as the runner), splits the SSE events, parses each chunk's JSON and
//       writes the delta's text as one message. No session, log, journal or protobuf.
//   node floor-relay.js gateway RUNNER_ADDR   a gRPC server whose every stream is piped, bytes as
//       they are, to a stream of its own on one channel to the runner, backpressure both ways.
//   mux-runner and mux-gateway: the same, but the hop between them is one stream for every
//       session, carrying all the tokens of one turn of the runner's event loop in one message.
//
// Each prints its port on stdout once it listens, and stops on SIGTERM.
import { pathToFileURL } from "node:url";
import * as grpc from "@grpc/grpc-js";
import { bytesStreamMethod } from "./bytes-method.js";
import { Agent } from "undici";
import { exitProcess } from "../../services/shared/process/exit.js";

export const FLOOR_METHOD = "/bench.Floor/Stream";
const identity = (b: Buffer) => b;
const definition = {
  stream: bytesStreamMethod(FLOOR_METHOD),
};
type Duplex = grpc.ServerDuplexStream<Buffer, Buffer>;

/** Writes `message`, waiting for drain when the stream is full; false once the stream is gone. */
async function write(call: Duplex, message: Buffer): Promise<boolean> {
  if (call.cancelled || call.writableEnded) return false;
  if (!call.write(message)) await new Promise((r) => call.once("drain", r));
  return true;
}

/** Streams the model's reply to `prompt`, handing each chunk's text to `onText` (false: stop reading). */
export async function streamReply(
  pool: Agent,
  modelOrigin: string,
  prompt: string,
  onText: (text: string) => boolean | Promise<boolean>,
): Promise<void> {
  const reply = await pool.request({
    origin: modelOrigin,
    path: "/v1/chat/completions",
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "scripted-1", stream: true, messages: [{ role: "user", content: prompt }] }),
  });
  if (reply.statusCode !== 200) throw new Error(`model answered ${reply.statusCode}`);
  let pending = "";
  for await (const chunk of reply.body) {
    pending += (chunk as Buffer).toString("utf8");
    let end = pending.indexOf("\n\n");
    while (end >= 0) {
      const event = pending.slice(0, end);
      pending = pending.slice(end + 2);
      end = pending.indexOf("\n\n");
      if (!event.startsWith("data: ") || event === "data: [DONE]") continue;
      const text = JSON.parse(event.slice(6)).choices?.[0]?.delta?.content;
      if (typeof text === "string" && text !== "" && !(await onText(text))) {
        reply.body.destroy();
        return;
      }
    }
  }
}

/** One gRPC stream per session, one message per token (Troupe's Attach today). */
function runner(modelOrigin: string): grpc.UntypedServiceImplementation {
  const pool = new Agent({ keepAliveTimeout: 60_000 });
  return {
    stream: (call: Duplex) => {
      call.once("data", (prompt: Buffer) => {
        streamReply(pool, modelOrigin, prompt.toString("utf8"), (text) => write(call, Buffer.from(text))).then(
          () => call.end(),
          (err: Error) => call.destroy(err),
        );
      });
    },
  };
}

// The multiplexed hop: one stream per gateway carries every session. Gateway to runner, one
// message per session: its id (u32) and its prompt. Runner to gateway, one message per turn of
// the event loop: records of id (u32), length (u32) and text, END_OF_STREAM for a finished one.
// A floor: no per-session flow control (the runner's buffer grows if the gateway stops reading).
const END_OF_STREAM = 0xffffffff;

function record(id: number, text: Buffer | undefined): Buffer {
  const out = Buffer.allocUnsafe(8 + (text?.length ?? 0));
  out.writeUInt32BE(id, 0);
  out.writeUInt32BE(text ? text.length : END_OF_STREAM, 4);
  text?.copy(out, 8);
  return out;
}

function muxRunner(modelOrigin: string): grpc.UntypedServiceImplementation {
  const pool = new Agent({ keepAliveTimeout: 60_000 });
  return {
    stream: (call: Duplex) => {
      let batch: Buffer[] = [];
      const add = (b: Buffer) => {
        if (batch.length === 0)
          setImmediate(() => {
            const out = Buffer.concat(batch);
            batch = [];
            if (!call.cancelled && !call.writableEnded) call.write(out);
          });
        batch.push(b);
        return true;
      };
      call.on("data", (req: Buffer) => {
        const id = req.readUInt32BE(0);
        const prompt = req.subarray(4).toString("utf8");
        streamReply(pool, modelOrigin, prompt, (text) => add(record(id, Buffer.from(text)))).then(
          () => add(record(id, undefined)),
          (err: Error) => call.destroy(err),
        );
      });
      call.on("end", () => call.end());
    },
  };
}

function muxGateway(runnerAddr: string): grpc.UntypedServiceImplementation {
  const channel = new grpc.Client(runnerAddr, grpc.credentials.createInsecure(), { "grpc.enable_http_proxy": 0 });
  const mux = channel.makeBidiStreamRequest(FLOOR_METHOD, identity, identity);
  const sessions = new Map<number, Duplex>();
  let nextId = 0;
  mux.on("data", (batch: Buffer) => {
    for (let at = 0; at < batch.length; ) {
      const id = batch.readUInt32BE(at);
      const len = batch.readUInt32BE(at + 4);
      at += 8;
      const call = sessions.get(id);
      if (len === END_OF_STREAM) {
        sessions.delete(id);
        call?.end();
        continue;
      }
      call?.write(batch.subarray(at, at + len));
      at += len;
    }
  });
  mux.on("error", (err: Error) => {
    for (const call of sessions.values()) call.destroy(err);
  });
  return {
    stream: (call: Duplex) => {
      call.once("data", (prompt: Buffer) => {
        const id = nextId++;
        sessions.set(id, call);
        const head = Buffer.allocUnsafe(4);
        head.writeUInt32BE(id, 0);
        mux.write(Buffer.concat([head, prompt]));
      });
    },
  };
}

function gateway(runnerAddr: string): grpc.UntypedServiceImplementation {
  const channel = new grpc.Client(runnerAddr, grpc.credentials.createInsecure(), { "grpc.enable_http_proxy": 0 });
  return {
    stream: (call: Duplex) => {
      const upstream = channel.makeBidiStreamRequest(FLOOR_METHOD, identity, identity);
      call.on("data", (b: Buffer) => upstream.write(b));
      call.on("end", () => upstream.end());
      call.on("cancelled", () => upstream.cancel());
      upstream.on("data", (b: Buffer) => {
        if (!call.write(b)) {
          upstream.pause();
          call.once("drain", () => upstream.resume());
        }
      });
      upstream.on("end", () => call.end());
      upstream.on("error", (err: Error) => call.destroy(err));
    },
  };
}

const ROLES: Record<string, (target: string) => grpc.UntypedServiceImplementation> = {
  runner,
  gateway,
  "mux-runner": muxRunner,
  "mux-gateway": muxGateway,
};

// Run as a program (the benchmark imports FLOOR_METHOD only).
if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const [role, target] = process.argv.slice(2);
  const serve = ROLES[role];
  if (!serve) throw new Error(`usage: floor-relay.js ${Object.keys(ROLES).join("|")} TARGET`);
  const server = new grpc.Server();
  server.addService(definition, serve(target));
  server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (err, port) => {
    if (err) throw err;
    process.stdout.write(`${port}\n`);
  });
  process.on("SIGTERM", () => {
    server.forceShutdown();
    void exitProcess(0);
  });
}
