// A2A on the HTTP edge: each agent's card, and the JSON-RPC binding (A2A 1.0: methods SendMessage,
// SendStreamingMessage, GetTask, CancelTask, SubscribeToTask; params and results are the
// protocol's messages as ProtoJSON; streams are server-sent events, one JSON-RPC response each;
// and 0.3's message/send, message/stream, tasks/get, tasks/cancel, tasks/resubscribe, v03.ts).
//   GET  /.well-known/agent-card.json                 the default agent's card
//   GET  /a2a/{agent}/.well-known/agent-card.json     an agent's card (its base URL: /a2a/{agent}/)
//   POST /a2a/{agent}                                 JSON-RPC
// Cards are public, as A2A discovery has them: they name the agent, its endpoints and the key
// scheme, nothing of any tenant's. Calls need a key, like every other route (admission.ts).
import { create, fromJson, type JsonValue, toJson } from "@bufbuild/protobuf";
import {
  CancelTaskRequestSchema,
  GetTaskRequestSchema,
  type SendMessageRequest,
  SendMessageRequestSchema,
  SendMessageResponseSchema,
  type StreamResponse,
  StreamResponseSchema,
  SubscribeToTaskRequestSchema,
  type Task,
  TaskSchema,
} from "../../shared/gen/lf/a2a/v1/a2a_pb.js";
import { sendRequestIn, streamOut, taskOut, taskParamsIn, V03_METHODS } from "./v03.js";
import { DEFAULT_AGENT } from "../../shared/ids.js";
import { listAgents } from "../http/agent-list.js";
import {
  answer,
  openEventStream,
  writeEvent,
  type NodeServerRequest,
  type NodeServerResponse,
} from "../http/answer.js";
import { forwardedMetadata } from "../http/metadata.js";
import { ApiError, readJson } from "../http/openai-request.js";
import { type A2aCore, a2aErrorOf, invalidParams } from "./a2a-core.js";

const CARD = "/.well-known/agent-card.json";
// An agent's base URL is /a2a/{agent}/ (a client finds its card relative to it); calls go to
// /a2a/{agent}, with or without the slash.
const ROUTE = /^\/a2a\/([^/]{1,64})(?:\/|(\/\.well-known\/agent-card\.json))?$/;

/** The protocol version this binding speaks (the A2A-Version header a client may send). */
const VERSION = "1.0";

export interface CardAddresses {
  /** The gateway's gRPC port, for the card's gRPC interface. */
  grpcPort: number;
  tls: boolean;
}

/** An agent's card (A2A AgentCard, as JSON), its URLs made from the address the caller used. */
export function agentCard(agent: string, req: NodeServerRequest, at: CardAddresses): JsonValue {
  const forwarded = (name: string) => {
    const v = req.headers[name];
    return typeof v === "string" && v !== "" ? v.split(",")[0].trim() : undefined;
  };
  const host = forwarded("x-forwarded-host") ?? req.headers.host ?? req.headers[":authority"] ?? "localhost";
  const scheme = forwarded("x-forwarded-proto") ?? (at.tls ? "https" : "http");
  // A Host header that is no host (the client's own doing) names the loopback in its card.
  const hostname = URL.canParse(`${scheme}://${host}`) ? new URL(`${scheme}://${host}`).hostname : "localhost";
  return {
    name: agent,
    description: `The Troupe agent ${agent}: send it a message; its reply is the task's artifact.`,
    version: "1.0.0",
    supportedInterfaces: [
      { url: `${scheme}://${host}/a2a/${agent}`, protocolBinding: "JSONRPC", protocolVersion: VERSION },
      {
        url: `${hostname.includes(":") ? `[${hostname}]` : hostname}:${at.grpcPort}`,
        protocolBinding: "GRPC",
        protocolVersion: VERSION,
        tenant: agent,
      },
    ],
    provider: { organization: "Troupe", url: "https://github.com/troupe" },
    capabilities: { streaming: true, pushNotifications: false },
    securitySchemes: {
      apiKey: {
        httpAuthSecurityScheme: {
          scheme: "Bearer",
          bearerFormat: "Troupe API key",
          description: "Authorization: Bearer <API key>",
        },
      },
    },
    securityRequirements: [{ schemes: { apiKey: { list: [] } } }],
    defaultInputModes: ["text/plain", "image/png", "image/jpeg", "image/gif", "image/webp", "application/json"],
    defaultOutputModes: ["text/plain"],
    skills: [
      {
        id: agent,
        name: agent,
        description: `Converse with the agent ${agent}; a context_id continues a conversation.`,
        tags: ["chat", "agent"],
      },
    ],
  };
}

type Rpc = { jsonrpc?: unknown; id?: unknown; method?: unknown; params?: unknown };

export function a2aJsonRpc(core: A2aCore, opts: { maxBodyBytes: number; agentsDir: string; card: CardAddresses }) {
  const send = (res: NodeServerResponse, body: unknown) =>
    answer(res, 200, { "content-type": "application/json" }, `${JSON.stringify(body)}\n`);
  const failure = (id: unknown, code: number, message: string) => ({
    jsonrpc: "2.0",
    id: id ?? null,
    error: { code, message },
  });

  const call = async (agent: string, req: NodeServerRequest, res: NodeServerResponse) => {
    let rpc: Rpc;
    try {
      rpc = (await readJson(req, opts.maxBodyBytes)) as Rpc;
    } catch (err) {
      return send(res, failure(null, -32700, err instanceof ApiError ? err.message : "the body is not JSON"));
    }
    const { id, method, params } = rpc;
    if (rpc.jsonrpc !== "2.0" || typeof method !== "string" || !(typeof id === "string" || typeof id === "number"))
      return send(res, failure(id, -32600, 'a JSON-RPC 2.0 request needs "jsonrpc": "2.0", a method and an id'));
    const metadata = forwardedMetadata(req.headers);
    const stop = new AbortController();
    res.once("close", () => stop.abort());
    // 0.3's methods are 1.0's with 0.3's JSON (v03.ts).
    const legacy = Object.hasOwn(V03_METHODS, method);
    const verb = legacy ? V03_METHODS[method] : method;
    const version = req.headers["a2a-version"];
    const served = legacy ? /^0\.3(\.\d+)?$/ : /^1(\.0)?$/;
    if (typeof version === "string" && version !== "" && !served.test(version))
      return send(
        res,
        failure(
          id,
          -32009,
          `A2A version ${version.slice(0, 20)} is not served for ${method.slice(0, 64)}: ${legacy ? "0.3" : VERSION} is`,
        ),
      );
    const parse = <T>(schema: Parameters<typeof fromJson>[0]) => {
      try {
        return fromJson(schema, (params ?? {}) as JsonValue) as T;
      } catch (err) {
        throw invalidParams(`params: ${(err as Error).message}`);
      }
    };
    const sendParams = () => (legacy ? sendRequestIn(params) : parse<SendMessageRequest>(SendMessageRequestSchema));
    const taskParams = <T>(schema: Parameters<typeof fromJson>[0]) =>
      (legacy ? create(schema, taskParamsIn(params) as never) : parse(schema)) as T;
    const taskResult = (t: Task) => (legacy ? taskOut(t) : toJson(TaskSchema, t));
    const update = (u: StreamResponse) => (legacy ? streamOut(u) : toJson(StreamResponseSchema, u));
    try {
      switch (verb) {
        case "SendMessage": {
          const result = await core.sendMessage(sendParams(), agent, metadata);
          return send(res, {
            jsonrpc: "2.0",
            id,
            result:
              legacy && result.payload.case === "task"
                ? taskOut(result.payload.value)
                : toJson(SendMessageResponseSchema, result),
          });
        }
        case "GetTask":
          return send(res, {
            jsonrpc: "2.0",
            id,
            result: taskResult(await core.getTask(taskParams(GetTaskRequestSchema), metadata)),
          });
        case "CancelTask":
          return send(res, {
            jsonrpc: "2.0",
            id,
            result: taskResult(await core.cancelTask(taskParams(CancelTaskRequestSchema), metadata)),
          });
        case "SendStreamingMessage":
        case "SubscribeToTask": {
          const updates =
            verb === "SendStreamingMessage"
              ? core.sendStreamingMessage(sendParams(), agent, metadata, stop.signal)
              : core.subscribeToTask(taskParams(SubscribeToTaskRequestSchema), metadata, stop.signal);
          // The first update is awaited before the stream's head: a refusal is a plain answer.
          const first = await updates.next();
          openEventStream(res);
          const write = (data: unknown) => writeEvent(res, data);
          try {
            if (!first.done) await write({ jsonrpc: "2.0", id, result: update(first.value) });
            for await (const u of updates) await write({ jsonrpc: "2.0", id, result: update(u) });
          } catch (err) {
            if (!res.destroyed) {
              const e = a2aErrorOf(err);
              await write(failure(id, e.jsonRpcCode, e.message));
            }
          }
          return res.end();
        }
        default:
          return send(res, failure(id, -32601, `method ${JSON.stringify(method.slice(0, 64))} is not served`));
      }
    } catch (err) {
      if (res.headersSent) return res.destroy();
      const e = a2aErrorOf(err);
      return send(res, failure(id, e.jsonRpcCode, e.message));
    }
  };

  return {
    /** Whether a request reads a card (public). */
    isPublic: (req: NodeServerRequest) => {
      const path = (req.url ?? "").split("?")[0];
      return req.method === "GET" && (path === CARD || (ROUTE.exec(path)?.[2] ?? "") !== "");
    },
    /** Answers the request when it is A2A's; false when it is not. */
    async serve(req: NodeServerRequest, res: NodeServerResponse): Promise<boolean> {
      const path = (req.url ?? "").split("?")[0];
      const m = ROUTE.exec(path);
      if (path !== CARD && !m) return false;
      const agent = path === CARD ? DEFAULT_AGENT : m![1];
      if (!(await listAgents(opts.agentsDir)).includes(agent)) {
        answer(res, 404, { "content-type": "text/plain" }, "no such agent\n");
        return true;
      }
      if (path === CARD || m?.[2]) {
        if (req.method !== "GET") answer(res, 405, { allow: "GET" }, "");
        else
          answer(
            res,
            200,
            { "content-type": "application/json", "cache-control": "max-age=60" },
            JSON.stringify(agentCard(agent, req, opts.card)),
          );
        return true;
      }
      if (req.method !== "POST") answer(res, 405, { allow: "POST" }, "");
      else await call(agent, req, res);
      return true;
    },
  };
}
