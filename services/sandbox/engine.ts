// The Docker Engine API, as much of it as Troupe uses (docs.docker.com/reference/api/engine):
// containers made, attached to, started, renamed, inspected, listed and removed; the engine's
// events; its ping and info; an image's presence. dockerode did this before, and loading it cost
// the sandbox service 5.6 MB resident with ssh2, protobufjs and tar-fs it pulled in for parts we
// never call (docs/benchmarks.md, bench/footprint). Paths carry no API version: the engine
// answers unversioned paths with its own, as dockerode relied on too.
//
// Where the engine is: DOCKER_HOST as the docker CLI reads it, unix:///path (the default,
// /var/run/docker.sock) or tcp://host:port, with TLS when DOCKER_TLS_VERIFY is set (the
// certificates in DOCKER_CERT_PATH, else ~/.docker). ssh:// is refused at start, said plainly.
import { readFileSync } from "node:fs";
import http from "node:http";
import https from "node:https";
import path from "node:path";
import type { Duplex, Readable } from "node:stream";
import { readCapped } from "../shared/net/bounded-body.js";

/** The engine answered with a status outside 2xx; `message` is the engine's own. */
export class EngineError extends Error {
  constructor(
    readonly statusCode: number,
    message: string,
  ) {
    super(message);
    this.name = "EngineError";
  }
}

/** How to reach the engine: a unix socket, or a host and port (with TLS material for https). */
export interface EngineAddress {
  socketPath?: string;
  host?: string;
  port?: number;
  tls?: { ca: Buffer; cert: Buffer; key: Buffer };
}

/** The engine settings (DOCKER_HOST, DOCKER_TLS_VERIFY, DOCKER_CERT_PATH; config.ts). */
export interface EngineSettings {
  dockerHost: string;
  dockerTlsVerify: boolean;
  dockerCertPath: string;
}

/** Where the settings point, as the docker CLI reads them. Throws for what it cannot reach. */
export function engineAddress(settings: EngineSettings): EngineAddress {
  const host = settings.dockerHost || "unix:///var/run/docker.sock";
  if (host.startsWith("unix://")) return { socketPath: host.slice("unix://".length) };
  if (host.startsWith("/")) return { socketPath: host };
  const m = /^(tcp|http|https):\/\/(\[[0-9a-fA-F:.]+\]|[^/:[\]]+)(?::(\d{1,5}))?\/?$/.exec(host);
  if (!m) throw new Error(`DOCKER_HOST=${host}: Troupe reaches an engine at unix:///path or tcp://host:port`);
  const tls = m[1] === "https" || settings.dockerTlsVerify;
  const address: EngineAddress = {
    host: m[2].replace(/^\[|\]$/g, ""),
    port: m[3] ? Number(m[3]) : tls ? 2376 : 2375,
  };
  if (!tls) return address;
  const pem = (name: string) => readFileSync(path.join(settings.dockerCertPath, name));
  return { ...address, tls: { ca: pem("ca.pem"), cert: pem("cert.pem"), key: pem("key.pem") } };
}

/** A container as the engine's list gives it (GET /containers/json). */
export interface ContainerSummary {
  Id: string;
  Names: string[];
  State: string;
  Labels: Record<string, string>;
  /** Seconds since the epoch. */
  Created: number;
}

/** What inspecting a container gives (GET /containers/{id}/json), the parts read here. */
export interface ContainerInfo {
  Id: string;
  Created: string;
  State: { Running: boolean };
  Config: { Labels?: Record<string, string> };
}

/** A label, name or event filter, as the engine takes it: field -> accepted values. */
export type Filters = Record<string, string[]>;

/**
 * A container's spec for POST /containers/create, the fields Troupe sets, named as the API names
 * them; `name` goes in the query. Typed field by field because the engine ignores a field it does
 * not know: a misspelt hardening option would be dropped without a word.
 */
export interface ContainerSpec {
  name?: string;
  Image: string;
  User: string;
  Cmd: string[];
  WorkingDir: string;
  Env: string[];
  NetworkDisabled: boolean;
  OpenStdin: boolean;
  StdinOnce: boolean;
  AttachStdin: boolean;
  AttachStdout: boolean;
  AttachStderr: boolean;
  Tty: boolean;
  Labels?: Record<string, string>;
  HostConfig: {
    NetworkMode: string;
    CapDrop: string[];
    CapAdd: string[];
    SecurityOpt: string[];
    ReadonlyRootfs: boolean;
    Init: boolean;
    PidsLimit: number;
    Memory: number;
    MemorySwap: number;
    NanoCpus: number;
    Ulimits: { Name: string; Soft: number; Hard: number }[];
    /** Mount point -> tmpfs options. */
    Tmpfs: Record<string, string>;
    LogConfig: { Type: string; Config: Record<string, string> };
    Runtime: string;
  };
}

/** One engine. Requests share kept-alive connections; `close()` lets them go. */
export class Engine {
  private readonly address: EngineAddress;
  private readonly agent: http.Agent;

  constructor(address: EngineAddress) {
    this.address = address;
    this.agent = address.tls
      ? new https.Agent({ keepAlive: true, ...address.tls })
      : new http.Agent({ keepAlive: true });
  }

  async ping(): Promise<void> {
    await this.json("GET", "/_ping");
  }

  info(): Promise<{ Runtimes?: Record<string, unknown> }> {
    return this.json("GET", "/info") as Promise<{ Runtimes?: Record<string, unknown> }>;
  }

  /** Resolves when the image is present; an EngineError 404 when it is not. */
  async inspectImage(name: string): Promise<void> {
    await this.json("GET", `/images/${encodeURIComponent(name)}/json`);
  }

  async createContainer(spec: ContainerSpec): Promise<Container> {
    const { name, ...body } = spec;
    const query = name ? `?name=${encodeURIComponent(name)}` : "";
    const made = (await this.json("POST", `/containers/create${query}`, body)) as { Id: string };
    return new Container(this, made.Id);
  }

  /** A handle on a container by id or name; nothing is asked of the engine until it is used. */
  getContainer(idOrName: string): Container {
    return new Container(this, idOrName);
  }

  listContainers(options: { all?: boolean; filters?: Filters }): Promise<ContainerSummary[]> {
    const query = new URLSearchParams({ all: options.all ? "1" : "0" });
    if (options.filters) query.set("filters", JSON.stringify(options.filters));
    return this.json("GET", `/containers/json?${query}`) as Promise<ContainerSummary[]>;
  }

  /** The engine's events matching `filters` from now on, one JSON object per line, until destroyed. */
  events(filters: Filters): Promise<Readable> {
    return this.answer("GET", `/events?filters=${encodeURIComponent(JSON.stringify(filters))}`);
  }

  /** POSTs `path` asking to upgrade the connection; the raw connection once the engine agrees (101). */
  upgrade(path: string): Promise<Duplex> {
    const req = this.request("POST", path, { connection: "Upgrade", upgrade: "tcp" });
    return new Promise((resolve, reject) => {
      req.on("upgrade", (_res, socket, head) => {
        if (head.length > 0) socket.unshift(head);
        resolve(socket);
      });
      // Anything but 101 is a refusal: the container is gone, or the engine will not attach.
      req.on("response", (res) => refusal(res).then(reject, reject));
      req.on("error", reject);
      req.end();
    });
  }

  close(): void {
    this.agent.destroy();
  }

  /** One request with a JSON body (if any); the parsed JSON answer, or undefined for an empty one. */
  async json(method: string, path: string, body?: unknown): Promise<unknown> {
    const res = await this.answer(method, path, body);
    const text = (await readCapped(res, Number.POSITIVE_INFINITY)).data.toString("utf8");
    if (!text) return undefined;
    return res.headers["content-type"]?.includes("json") ? JSON.parse(text) : text;
  }

  /** One request; the engine's answer, its body unread, when its status is 2xx, else an EngineError. */
  private answer(method: string, path: string, body?: unknown): Promise<http.IncomingMessage> {
    const payload = body === undefined ? undefined : JSON.stringify(body);
    const req = this.request(method, path, payload === undefined ? {} : { "content-type": "application/json" });
    return new Promise((resolve, reject) => {
      req.on("response", (res) => {
        const status = res.statusCode ?? 0;
        if (status >= 200 && status < 300) resolve(res);
        else refusal(res).then(reject, reject);
      });
      req.on("error", reject);
      req.end(payload);
    });
  }

  private request(method: string, path: string, headers: http.OutgoingHttpHeaders): http.ClientRequest {
    const { socketPath, host, port, tls } = this.address;
    const options = { method, path, headers, agent: this.agent, socketPath, host, port };
    return tls ? https.request(options) : http.request(options);
  }
}

/** A container of one engine, by id (or by the name it was asked by). */
export class Container {
  constructor(
    private readonly engine: Engine,
    readonly id: string,
  ) {}

  private get path(): string {
    return `/containers/${encodeURIComponent(this.id)}`;
  }

  inspect(): Promise<ContainerInfo> {
    return this.engine.json("GET", `${this.path}/json`) as Promise<ContainerInfo>;
  }

  async start(): Promise<void> {
    await this.engine.json("POST", `${this.path}/start`);
  }

  async rename(name: string): Promise<void> {
    await this.engine.json("POST", `${this.path}/rename?name=${encodeURIComponent(name)}`);
  }

  /** Removes it, running or not (force), with its anonymous volumes. */
  async remove(): Promise<void> {
    await this.engine.json("DELETE", `${this.path}?force=1&v=1`);
  }

  /**
   * Its stdin, stdout and stderr on one connection (attach, upgraded): the engine's 8-byte frames
   * tell stdout from stderr, since containers here have no TTY.
   */
  attach(): Promise<Duplex> {
    return this.engine.upgrade(`${this.path}/attach?stream=1&stdin=1&stdout=1&stderr=1`);
  }
}

/** The most of an answer's body read for an error message: the engine's are one short JSON object. */
const MAX_ERROR_BYTES = 16 * 1024;

/** An EngineError from a refusal: the engine's `{"message"}`, else the status and what came. */
async function refusal(res: http.IncomingMessage): Promise<EngineError> {
  const status = res.statusCode ?? 0;
  const text = await readCapped(res, MAX_ERROR_BYTES).then(
    (r) => r.data.toString("utf8").trim(),
    () => "",
  );
  let message = text;
  try {
    const doc = JSON.parse(text) as { message?: unknown };
    if (typeof doc.message === "string") message = doc.message;
  } catch {
    // not JSON: the text as it came
  }
  return new EngineError(status, `the Docker engine answered ${status}: ${message.slice(0, 500) || res.statusMessage}`);
}
