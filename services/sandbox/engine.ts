// The Docker Engine API through dockerode (docs.docker.com/reference/api/engine), as much of it as
// Troupe uses: containers made, attached to, started, renamed, inspected, listed and removed; the
// engine's events; its ping and info; an image's presence. dockerode (with docker-modem) speaks to
// the engine wherever the docker CLI would: a unix socket, tcp with TLS, or ssh (engine-address.ts
// finds which). It is loaded on first use, so a process that never asks the engine never pays for it.
//
// Every refusal is an EngineError with the engine's status and its own message, bounded.
import http from "node:http";
import https from "node:https";
import type { Duplex, Readable } from "node:stream";
import { inspect } from "node:util";
import type Dockerode from "dockerode";
import { describeEngine, type EngineAddress } from "./engine-address.js";
import { sshOptions } from "./engine-ssh.js";

export { describeEngine, type EngineAddress, type EngineSettings, engineAddress } from "./engine-address.js";

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

/**
 * `agent`, printed by util.inspect as its kind alone. docker-modem builds a debug line of every
 * request's options, the agent with its sockets included (showHidden, no depth limit), whether or
 * not its debug output is on: 8.6 KB of text and 0.26 ms a request here, and 0.7 s of the sandbox
 * service's CPU in one bench/sandbox run.
 */
function briefly<A extends http.Agent>(agent: A): A {
  return Object.defineProperty(agent, inspect.custom, { value: () => `[${agent.constructor.name} keepAlive]` });
}

/** One engine. Requests share kept-alive connections; `close()` lets them go. */
export class Engine {
  private client?: Promise<Dockerode>;
  private readonly agent?: http.Agent;

  constructor(readonly address: EngineAddress) {
    // ssh:// makes its own connections (docker-modem's ssh agent); the others keep theirs alive.
    if (!("protocol" in address) || address.protocol !== "ssh")
      this.agent = briefly(
        "tls" in address ? new https.Agent({ keepAlive: true, ...address.tls }) : new http.Agent({ keepAlive: true }),
      );
  }

  /** Where it is, for messages. */
  get name(): string {
    return describeEngine(this.address);
  }

  async ping(): Promise<void> {
    await this.call((d) => d.ping());
  }

  info(): Promise<{ Runtimes?: Record<string, unknown> }> {
    return this.call((d) => d.info());
  }

  /** Resolves when the image is present; an EngineError 404 when it is not. */
  async inspectImage(name: string): Promise<void> {
    await this.call((d) => d.getImage(name).inspect());
  }

  async createContainer(spec: ContainerSpec): Promise<Container> {
    const { name, ...body } = spec;
    // The name in the query, the spec as the body only: dockerode would put every field in both.
    const options = { _query: name ? { name } : {}, _body: body } as unknown as Dockerode.ContainerCreateOptions;
    const made = await this.call((d) => d.createContainer(options));
    return new Container(this, made.id);
  }

  /** A handle on a container by id or name; nothing is asked of the engine until it is used. */
  getContainer(idOrName: string): Container {
    return new Container(this, idOrName);
  }

  listContainers(options: { all?: boolean; filters?: Filters }): Promise<ContainerSummary[]> {
    return this.call((d) => d.listContainers(options)) as Promise<ContainerSummary[]>;
  }

  /** The engine's events matching `filters` from now on, one JSON object per line, until destroyed. */
  events(filters: Filters): Promise<Readable> {
    return this.call((d) => d.getEvents({ filters })) as Promise<Readable>;
  }

  close(): void {
    this.agent?.destroy();
  }

  /** `op` on the client (made on first use); a refusal as an EngineError. */
  async call<T>(op: (docker: Dockerode) => Promise<T>): Promise<T> {
    this.client ??= import("dockerode").then((m) => new m.default(this.options()));
    try {
      return await op(await this.client);
    } catch (err) {
      throw asEngineError(err);
    }
  }

  /** docker-modem's options, every key given, so none of its own reading of the environment applies. */
  private options(): Dockerode.DockerOptions {
    const a = this.address;
    const none = { socketPath: undefined, host: undefined, port: undefined, protocol: undefined };
    if ("socketPath" in a) return { ...none, socketPath: a.socketPath, agent: this.agent } as Dockerode.DockerOptions;
    if (a.protocol === "ssh")
      return {
        ...none,
        protocol: "ssh",
        host: a.host,
        port: a.port,
        username: a.username,
        sshOptions: sshOptions(a.host, a.port, a.ssh),
      } as Dockerode.DockerOptions;
    const tls = a.protocol === "https" ? a.tls : undefined;
    return {
      ...none,
      protocol: a.protocol,
      host: a.host,
      port: a.port,
      agent: this.agent,
      ...tls,
    } as Dockerode.DockerOptions;
  }
}

/** A container of one engine, by id (or by the name it was asked by). */
export class Container {
  constructor(
    private readonly engine: Engine,
    readonly id: string,
  ) {}

  inspect(): Promise<ContainerInfo> {
    return this.engine.call((d) => d.getContainer(this.id).inspect()) as Promise<ContainerInfo>;
  }

  async start(): Promise<void> {
    await this.engine.call((d) => d.getContainer(this.id).start());
  }

  async rename(name: string): Promise<void> {
    await this.engine.call((d) => d.getContainer(this.id).rename({ name }));
  }

  /** Removes it, running or not (force), with its anonymous volumes. */
  async remove(): Promise<void> {
    await this.engine.call((d) => d.getContainer(this.id).remove({ force: true, v: true }));
  }

  /**
   * Its stdin, stdout and stderr on one connection (attach, upgraded): the engine's 8-byte frames
   * tell stdout from stderr, since containers here have no TTY.
   */
  attach(): Promise<Duplex> {
    return this.engine.call(
      (d) =>
        d
          .getContainer(this.id)
          .attach({ stream: true, stdin: true, stdout: true, stderr: true, hijack: true }) as Promise<Duplex>,
    );
  }
}

/** The most of the engine's message kept: its refusals are one short JSON object. */
const MAX_MESSAGE_CHARS = 500;

/** docker-modem's error (statusCode, json) as an EngineError; a connection's error as it came. */
function asEngineError(err: unknown): unknown {
  const e = err as { statusCode?: number; json?: unknown; message?: string };
  if (typeof e?.statusCode !== "number") return err;
  const doc = e.json as { message?: unknown } | string | null | undefined;
  const message = typeof doc === "string" ? doc : typeof doc?.message === "string" ? doc.message : (e.message ?? "");
  return new EngineError(
    e.statusCode,
    `the Docker engine answered ${e.statusCode}: ${message.trim().slice(0, MAX_MESSAGE_CHARS)}`,
  );
}
