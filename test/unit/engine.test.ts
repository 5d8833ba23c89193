// The Docker Engine API client (services/sandbox/engine.ts): where DOCKER_HOST points, and what
// it makes of an engine's answers. The engine here is a unix-socket server answering as the
// Engine API reference says an engine does (docs.docker.com/reference/api/engine/version/v1.47:
// errors as {"message": ...} with 404 for a missing object and 409 for a name in use; attach
// upgraded with 101 and raw bytes after; events as one JSON object per line). The real engine
// is driven by the end-to-end tier (sandbox-api, sandbox-attacks, sandbox-scopes).
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdir, mkdtemp, rm, symlink, writeFile } from "node:fs/promises";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import util from "node:util";
import { Engine, EngineError, type EngineSettings, engineAddress } from "../../services/sandbox/engine.js";
import { SandboxFleet } from "../../services/sandbox/fleet.js";
import { type ContainerDeath, ContainerEvents } from "../../services/sandbox/container-events.js";
import { containerSpec, DEFAULT_LIMITS, type FleetOptions } from "../../services/sandbox/container-spec.js";
import { createLogger } from "../../services/shared/process/log.js";

/** The SSH settings of an address when the test gives none. */
const NO_SSH = { homeDir: undefined, sshAuthSock: undefined };

describe("where the engine is", () => {
  /** The settings as config.ts gives them: DOCKER_HOST and what else is given. */
  const at = (dockerHost: string, more: Partial<EngineSettings> = {}, exists = (_p: string) => false) =>
    engineAddress({ dockerHost, dockerTlsVerify: false, dockerCertPath: "/nowhere", ...more }, exists);
  let dir: string;
  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "troupe-docker-config-"));
  });
  after(() => rm(dir, { recursive: true, force: true }));

  /** A context as `docker context create NAME --docker host=HOST` stores it (with TLS files if given). */
  const context = async (configDir: string, name: string, host: string, tls = false) => {
    const id = createHash("sha256").update(name).digest("hex");
    const meta = path.join(configDir, "contexts", "meta", id);
    await mkdir(meta, { recursive: true });
    const doc = { Name: name, Metadata: {}, Endpoints: { docker: { Host: host, SkipTLSVerify: false } } };
    await writeFile(path.join(meta, "meta.json"), JSON.stringify(doc));
    if (!tls) return;
    const tlsDir = path.join(configDir, "contexts", "tls", id, "docker");
    await mkdir(tlsDir, { recursive: true });
    for (const f of ["ca.pem", "cert.pem", "key.pem"]) await writeFile(path.join(tlsDir, f), `${name} ${f}`);
  };

  test("DOCKER_HOST: unix sockets", () => {
    assert.deepEqual(at("unix:///run/docker/docker.sock"), {
      from: "DOCKER_HOST",
      socketPath: "/run/docker/docker.sock",
    });
    assert.deepEqual(at("/var/run/docker.sock"), { from: "DOCKER_HOST", socketPath: "/var/run/docker.sock" });
  });

  test("DOCKER_HOST: tcp with the CLI's default ports, and ssh with its user", () => {
    assert.deepEqual(at("tcp://10.0.0.5:2375"), {
      from: "DOCKER_HOST",
      protocol: "http",
      host: "10.0.0.5",
      port: 2375,
    });
    assert.deepEqual(at("tcp://dind"), { from: "DOCKER_HOST", protocol: "http", host: "dind", port: 2375 });
    assert.deepEqual(at("tcp://[::1]:2375"), { from: "DOCKER_HOST", protocol: "http", host: "::1", port: 2375 });
    assert.deepEqual(at("ssh://me@box"), {
      from: "DOCKER_HOST",
      protocol: "ssh",
      host: "box",
      port: 22,
      username: "me",
      ssh: NO_SSH,
    });
    assert.deepEqual(at("ssh://box:2222"), {
      from: "DOCKER_HOST",
      protocol: "ssh",
      host: "box",
      port: 2222,
      username: undefined,
      ssh: NO_SSH,
    });
  });

  test("DOCKER_TLS_VERIFY: TLS on 2376 with the certificates of DOCKER_CERT_PATH", async () => {
    const certs = path.join(dir, "certs");
    await mkdir(certs);
    for (const name of ["ca.pem", "cert.pem", "key.pem"]) await writeFile(path.join(certs, name), name);
    const a = at("tcp://engine", { dockerTlsVerify: true, dockerCertPath: certs });
    assert.ok("protocol" in a && a.protocol === "https");
    assert.equal(a.port, 2376);
    assert.equal(a.tls?.ca.toString(), "ca.pem");
    assert.equal(a.tls?.key.toString(), "key.pem");
    assert.throws(() => at("tcp://engine", { dockerTlsVerify: true, dockerCertPath: `${certs}/none` }), /ENOENT/);
  });

  test("no DOCKER_HOST: the context DOCKER_CONTEXT names, else the config's current one", async () => {
    const configDir = path.join(dir, "contexts-config");
    await context(configDir, "remote", "ssh://ops@build-box");
    await context(configDir, "secure", "tcp://10.1.1.1:2376", true);
    await writeFile(path.join(configDir, "config.json"), JSON.stringify({ currentContext: "remote" }));
    assert.deepEqual(at("", { dockerConfigDir: configDir }), {
      from: 'docker context "remote"',
      protocol: "ssh",
      host: "build-box",
      port: 22,
      username: "ops",
      ssh: NO_SSH,
    });
    const secure = at("", { dockerConfigDir: configDir, dockerContext: "secure" });
    assert.ok("tls" in secure, "a context's stored TLS material is used");
    assert.equal(secure.tls?.cert.toString(), "secure cert.pem");
    // DOCKER_HOST wins over any context, as with the CLI.
    assert.equal(at("tcp://h:1", { dockerConfigDir: configDir }).from, "DOCKER_HOST");
    // "default" is the engine's default socket.
    assert.equal(at("", { dockerConfigDir: configDir, dockerContext: "default" }).from, "the default socket");
    assert.throws(
      () => at("", { dockerConfigDir: configDir, dockerContext: "gone" }),
      /docker context "gone": not found/,
    );
  });

  test("nothing named: the system socket, else the rootless one, else Docker Desktop's", () => {
    const present =
      (...paths: string[]) =>
      (p: string) =>
        paths.includes(p);
    const more = { runtimeDir: "/run/user/1000", homeDir: "/home/me", dockerConfigDir: path.join(dir, "none") };
    assert.deepEqual(at("", more, present("/var/run/docker.sock", "/run/user/1000/docker.sock")), {
      from: "the default socket",
      socketPath: "/var/run/docker.sock",
    });
    assert.equal(
      (at("", more, present("/run/user/1000/docker.sock")) as { socketPath: string }).socketPath,
      "/run/user/1000/docker.sock",
    );
    assert.equal(
      (at("", more, present("/home/me/.docker/run/docker.sock")) as { socketPath: string }).socketPath,
      "/home/me/.docker/run/docker.sock",
    );
    assert.equal((at("", more) as { socketPath: string }).socketPath, "/var/run/docker.sock");
  });

  test("what it cannot reach is refused by name", () => {
    for (const host of ["npipe:////./pipe/docker_engine", "tcp://", "docker.sock", "tcp://me@host:2375"])
      assert.throws(() => at(host), /DOCKER_HOST=/, host);
  });

  test("a context's engine is reached (a real socket, found through a context and through the rootless path)", async () => {
    const socketPath = path.join(dir, "ctx.sock");
    const server = http.createServer((_req, res) => res.writeHead(200, { "content-type": "text/plain" }).end("OK"));
    await new Promise<void>((resolve) => server.listen(socketPath, resolve));
    try {
      const configDir = path.join(dir, "reach-config");
      await context(configDir, "local", `unix://${socketPath}`);
      for (const address of [
        at("", { dockerConfigDir: configDir, dockerContext: "local" }),
        at("", { runtimeDir: dir, dockerConfigDir: configDir }, (p) => p === path.join(dir, "docker.sock")),
      ]) {
        if ("socketPath" in address && address.from === "the default socket") {
          // the rootless path is <runtime dir>/docker.sock: point it at the test engine
          await symlink(socketPath, path.join(dir, "docker.sock")).catch(() => undefined);
        }
        const engine = new Engine(address);
        try {
          await engine.ping();
        } finally {
          engine.close();
        }
      }
    } finally {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    }
  });
});

const OPTS: FleetOptions = {
  image: "img",
  runtime: "runc",
  instance: "t",
  limits: DEFAULT_LIMITS,
  poolSize: 0,
  idleMs: 60_000,
  maxAgeMs: 0,
};

/** A fleet of no pool on `engine`: what it does with the engine's events. */
const fleetOn = (engine: Engine) => new SandboxFleet(engine, OPTS, createLogger("test", "error"));

describe("an engine's answers", () => {
  let dir: string;
  let server: http.Server;
  let engine: Engine;
  /** What the test engine does with the next request. */
  let answer: (req: http.IncomingMessage, res: http.ServerResponse) => void;
  const seen: { method?: string; url?: string; body: string }[] = [];
  const upgraded = new Set<import("node:stream").Duplex>();

  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "troupe-engine-"));
    const socketPath = path.join(dir, "docker.sock");
    server = http.createServer((req, res) => {
      let body = "";
      req.on("data", (d) => (body += d));
      req.on("end", () => {
        seen.push({ method: req.method, url: req.url, body });
        answer(req, res);
      });
    });
    server.on("upgrade", (req, socket, head) => {
      seen.push({ method: req.method, url: req.url, body: head.toString() });
      // As the engine does: 101, then the container's stdio on the same connection.
      socket.write("HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\n");
      socket.write("Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n");
      socket.write(Buffer.from([1, 0, 0, 0, 0, 0, 0, 2, 0x68, 0x69])); // stdout: "hi"
      socket.on("data", (d) => socket.write(d)); // stdin echoed back, raw
      socket.on("end", () => socket.end());
      upgraded.add(socket);
    });
    await new Promise<void>((resolve) => server.listen(socketPath, resolve));
    engine = new Engine({ from: "test", socketPath });
  });

  after(async () => {
    engine.close();
    server.closeAllConnections();
    for (const s of upgraded) s.destroy();
    await new Promise((resolve) => server.close(resolve));
    await rm(dir, { recursive: true, force: true });
  });

  const json = (res: http.ServerResponse, status: number, doc: unknown) =>
    res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(doc));

  test("create: the name in the query, the spec as the body", async () => {
    answer = (_req, res) => json(res, 201, { Id: "c0ffee", Warnings: [] });
    const { name, ...spec } = containerSpec(OPTS, "troupe-sbx-1", "session:s1");
    const c = await engine.createContainer({ name, ...spec });
    assert.equal(c.id, "c0ffee");
    const req = seen.at(-1)!;
    assert.equal(req.method, "POST");
    assert.equal(req.url, "/containers/create?name=troupe-sbx-1");
    assert.deepEqual(JSON.parse(req.body), spec);
  });

  // docker-modem prints every request's options for its debug line, debug on or not: the
  // kept-alive agent with its sockets was 8.6 KB of text a request.
  test("a request's options are cheap to print", async () => {
    answer = (_req, res) => res.writeHead(200, { "content-type": "text/plain" }).end("OK");
    await engine.ping();
    const printed: number[] = [];
    const inspect = util.inspect;
    util.inspect = ((value: unknown, options?: util.InspectOptions) => {
      const text = inspect(value, options);
      if (options?.showHidden && String((value as { path?: string })?.path).includes("/_ping"))
        printed.push(text.length);
      return text;
    }) as typeof util.inspect;
    try {
      await engine.ping();
    } finally {
      util.inspect = inspect;
    }
    assert.equal(printed.length, 1, "docker-modem printed the request's options once");
    assert.ok(printed[0] < 1000, `the options printed as ${printed[0]} characters`);
  });

  test("a name in use: 409 with the engine's message; a missing object: 404", async () => {
    answer = (_req, res) => json(res, 409, { message: 'Conflict. The container name "/x" is already in use' });
    const conflict = await engine.createContainer(containerSpec(OPTS, "x", "session:s1")).catch((e) => e);
    assert.ok(conflict instanceof EngineError);
    assert.equal(conflict.statusCode, 409);
    assert.match(conflict.message, /already in use/);
    answer = (_req, res) => json(res, 404, { message: "No such container: gone" });
    const missing = await engine
      .getContainer("gone")
      .remove()
      .catch((e) => e);
    assert.equal(missing.statusCode, 404);
    const removal = new URL(seen.at(-1)!.url!, "http://engine");
    assert.equal(removal.pathname, "/containers/gone");
    assert.equal(removal.searchParams.get("force"), "true");
    assert.equal(removal.searchParams.get("v"), "true");
  });

  test("a refusal that is not JSON: the status and a bounded message", async () => {
    answer = (_req, res) => res.writeHead(502, { "content-type": "text/html" }).end(`<html>${"x".repeat(100_000)}`);
    const err = await engine.ping().catch((e) => e);
    assert.equal(err.statusCode, 502);
    assert.ok(err.message.length < 600, `${err.message.length} characters`);
  });

  test("list: every container, label filters as the engine's JSON", async () => {
    answer = (_req, res) => json(res, 200, [{ Id: "a", Names: ["/n"], State: "running", Labels: {}, Created: 1 }]);
    const list = await engine.listContainers({ all: true, filters: { label: ["troupe.instance=i"] } });
    assert.equal(list[0].Id, "a");
    const url = new URL(seen.at(-1)!.url!, "http://engine");
    assert.equal(url.searchParams.get("all"), "true");
    assert.deepEqual(JSON.parse(url.searchParams.get("filters")!), { label: ["troupe.instance=i"] });
  });

  test("attach: the upgraded connection carries the engine's frames and our bytes", async () => {
    const stream = await engine.getContainer("c0ffee").attach();
    const got: Buffer[] = [];
    stream.on("data", (d: Buffer) => got.push(d));
    stream.write("ping");
    const deadline = Date.now() + 2000;
    while (Buffer.concat(got).length < 14 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
    const all = Buffer.concat(got);
    assert.deepEqual([...all.subarray(0, 10)], [1, 0, 0, 0, 0, 0, 0, 2, 0x68, 0x69]);
    assert.equal(all.subarray(10).toString(), "ping");
    const url = new URL(seen.at(-1)!.url!, "http://engine");
    assert.equal(url.pathname, "/containers/c0ffee/attach");
    for (const p of ["stream", "stdin", "stdout", "stderr"]) assert.equal(url.searchParams.get(p), "true", p);
    stream.destroy();
  });

  test("events split across chunks still count (an OOM kill seen by the fleet)", async () => {
    const line = `${JSON.stringify({ Type: "container", Action: "oom", Actor: { ID: "deadbeef", Attributes: {} } })}\n`;
    answer = (_req, res) => {
      res.writeHead(200, { "content-type": "application/json" });
      res.write(line.slice(0, 20));
      setTimeout(() => res.write(line.slice(20)), 50);
    };
    const fleet = fleetOn(engine);
    await fleet.watch();
    const deadline = Date.now() + 2000;
    while (fleet.ooms("deadbeef") === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
    assert.equal(fleet.ooms("deadbeef"), 1);
    const filters = JSON.parse(new URL(seen.at(-1)!.url!, "http://engine").searchParams.get("filters")!);
    assert.deepEqual(filters.event, ["oom", "die"]);
    await fleet.shutdown();
  });

  test("a container's end is passed on with its name and exit code; garbage lines are skipped", async () => {
    const die = {
      Type: "container",
      Action: "die",
      Actor: { ID: "c0ffee", Attributes: { name: "sbx", exitCode: "3", "troupe.scope": "session:t.u.s" } },
    };
    answer = (_req, res) => {
      res.writeHead(200, { "content-type": "application/json" });
      res.write(`not json\n${JSON.stringify(die)}\n`);
    };
    const deaths: ContainerDeath[] = [];
    const events = new ContainerEvents(engine, "i", (d) => deaths.push(d));
    await events.watch();
    const deadline = Date.now() + 2000;
    while (deaths.length === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
    assert.deepEqual(deaths, [{ id: "c0ffee", name: "sbx", exitCode: "3", scope: "session:t.u.s" }]);
    events.close();
  });

  test("an event stream the engine ended is asked for again; a live one is kept", async () => {
    const fleet = fleetOn(engine);
    const eventRequests = () => seen.filter((r) => r.url?.startsWith("/events?")).length;
    let open: http.ServerResponse | undefined;
    answer = (_req, res) => {
      res.writeHead(200, { "content-type": "application/json" }).write("");
      open = res;
    };
    const before = eventRequests();
    await Promise.all([fleet.watch(), fleet.watch()]); // two checks at once ask once
    await fleet.watch(); // live: kept
    assert.equal(eventRequests(), before + 1);
    open!.end(); // the engine restarts
    const deadline = Date.now() + 2000;
    while (Date.now() < deadline) {
      await fleet.watch();
      if (eventRequests() === before + 2) break;
      await new Promise((r) => setTimeout(r, 20));
    }
    assert.equal(eventRequests(), before + 2);
    await fleet.shutdown();
    await fleet.watch(); // shut down: never again
    assert.equal(eventRequests(), before + 2);
  });
});
