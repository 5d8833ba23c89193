// Process lifecycle: `troupe up` as a supervisor, SIGTERM draining, and the chat CLI.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync, execFile, type ChildProcess } from "node:child_process";
import { mkdir, mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import {
  Health,
  HealthCheckResponse_ServingStatus as Serving,
} from "../services/shared/gen/grpc/health/v1/health_pb.js";
import { GatewayService } from "../services/shared/gen/troupe/v1/gateway_pb.js";
import { Role } from "../services/shared/gen/troupe/v1/session_pb.js";
import { RouterService } from "../services/shared/gen/troupe/v1/router_pb.js";
import { clientApiKey, internalCredentials } from "../services/shared/auth/auth.js";
import { createClient } from "../services/shared/rpc.js";
import { Status } from "../services/shared/errors.js";
import { ChatSession } from "./helpers/session.js";
import {
  MAIN,
  SERVICE_TYPE,
  flagsFor,
  freePort,
  sandboxContainers,
  startStack,
  troupeChat,
  stopUp,
  waitFor,
  waitServing,
  startUp,
  writeAgent,
  type StackAddresses,
} from "./helpers/stack.js";

const run = promisify(execFile);
const internalHeaders = async (dataDir: string) => (await internalCredentials(dataDir)).headers;

describe("troupe up", () => {
  let dataDir: string;
  let addr: StackAddresses;
  let up: ChildProcess;
  let log: () => string;

  before(async () => {
    dataDir = await mkdtemp(path.join(os.tmpdir(), "troupe-up-"));
    ({ proc: up, addr, log } = await startUp(dataDir));
  });

  after(async () => {
    // When the Ctrl-C test did not run (filtered out, or failed before it).
    await stopUp(up);
    await rm(dataDir, { recursive: true, force: true });
  });

  test("starts the scripted model when no endpoint is configured, and says so", () => {
    // In plain lines like its services' (its output is a pipe here; no TROUPE_LOG_FORMAT set).
    assert.match(log(), /warn {2}up: OPENAI_BASE_URL is not set: using Troupe's scripted model server/);
    assert.deepEqual(
      log()
        .split("\n")
        .filter((l) => l.startsWith("{")),
      [],
      "no JSON lines",
    );
    for (const name of ["router", "memory", "sandbox", "runner", "gateway"])
      assert.match(log(), new RegExp(`${name}: ${name === "runner" ? "runner \\S+ serving" : `${name} serving`}`));
  });

  test("makes a development key and an internal token on first start, and says how to use the key", async () => {
    const key = (await readFile(path.join(dataDir, "auth", "dev-key"), "utf8")).trim();
    assert.match(log(), new RegExp(`development API key \\(tenant local, principal dev, made just now\\): ${key}`));
    assert.match(await readFile(path.join(dataDir, "auth", "api-keys.json"), "utf8"), /"principal": "dev"/);
    assert.doesNotMatch(
      await readFile(path.join(dataDir, "auth", "api-keys.json"), "utf8"),
      new RegExp(key),
      "only the key's hash is stored",
    );
    assert.equal(
      (await stat(path.join(dataDir, "auth", "dev-key"))).mode & 0o077,
      0,
      "the key file is readable by its owner only",
    );
    assert.ok((await readFile(path.join(dataDir, "auth", "internal-token"), "utf8")).trim().length >= 32);
  });

  test("restarts a crashed child, and the stack serves again", async () => {
    const router = createClient(RouterService, addr.router, { headers: await internalHeaders(dataDir) });
    const before = (await router.listRunners({})).runners;
    assert.equal(before.length, 1);
    // Find the runner's pid through its gRPC port's owner: the child of `up` with "runner" in argv.
    const { stdout } = await run("pgrep", ["-P", String(up.pid), "-f", " runner "]);
    const pid = Number(stdout.trim().split("\n")[0]);
    assert.ok(pid > 0);
    process.kill(pid, "SIGKILL");
    await waitFor("the supervisor to notice", async () => /runner exited \(SIGKILL\); restarting/.test(log()));
    await waitServing(addr.runner, 30_000, SERVICE_TYPE.runner);
    const gateway = createClient(GatewayService, addr.gateway, {
      headers: { authorization: `Bearer ${await clientApiKey(dataDir)}` },
    });
    const s = new ChatSession(gateway);
    s.open();
    await s.waitOpened();
    s.prompt("are you back?");
    const end = await s.waitForPayload("agentEnd", 20_000);
    s.close();
    gateway.close();
    router.close();
    assert.equal(end.payload.case, "agentEnd");
  });

  test("troupe status says all is well; troupe logs shows what each service wrote", async () => {
    const troupe = (...args: string[]) =>
      spawnSync(process.execPath, [MAIN, ...args, ...flagsFor(addr, dataDir)], { encoding: "utf8", timeout: 30_000 });
    const status = troupe("status");
    assert.equal(status.status, 0, status.stdout + status.stderr);
    for (const name of ["gateway", "router", "runner", "memory", "sandbox", "model", "docker", "image", "keys", "data"])
      assert.match(status.stdout, new RegExp(`^ok +${name} `, "m"), status.stdout);
    const logs = troupe("logs", "--service", "gateway", "-n", "100");
    assert.equal(logs.status, 0, logs.stderr);
    assert.match(logs.stdout, /gateway: gateway serving on port/, logs.stdout + logs.stderr);
    assert.doesNotMatch(logs.stdout, /router: /, logs.stdout);
    // The services start at once, so which of them serves first is not fixed: what is, is that
    // every service's lines are there and the merge keeps their times in order.
    const merged = troupe("logs", "-n", "1000");
    assert.equal(merged.status, 0, merged.stderr);
    for (const name of ["router", "gateway", "runner", "memory", "sandbox"])
      assert.match(merged.stdout, new RegExp(`^\\S+ +\\w+ +${name}: `, "m"), `${name} in the merge:\n${merged.stdout}`);
    const times = merged.stdout
      .split("\n")
      .filter(Boolean)
      .map((l) => l.slice(0, 24));
    assert.ok(
      times.every((t, i) => i === 0 || times[i - 1] <= t),
      `merged in time order:\n${merged.stdout}${merged.stderr}`,
    );
    const unknown = troupe("logs", "--service", "gatewya");
    assert.equal(unknown.status, 2, unknown.stdout + unknown.stderr);
    assert.match(
      unknown.stderr,
      /no log for "gatewya"; there are: gateway, memory, model-server, router, runner, sandbox/,
    );
  });

  test("the router runs on V8's interpreter alone, the sandbox up to Maglev, the gateway deferred, the rest with every tier", async () => {
    const tierFlags = async (name: string) => {
      const { stdout } = await run("pgrep", ["-P", String(up.pid), "-f", ` ${name} `]);
      const pid = Number(stdout.trim().split("\n")[0]);
      const cmdline = (await readFile(`/proc/${pid}/cmdline`, "utf8")).split("\0");
      return cmdline.filter((a) => /^--(max-opt|no-maglev|no-turbofan)/.test(a));
    };
    assert.deepEqual(await tierFlags("router"), ["--max-opt=0"]);
    assert.deepEqual(await tierFlags("sandbox"), ["--max-opt=2"]);
    assert.deepEqual(await tierFlags("gateway"), ["--no-maglev", "--no-turbofan"]);
    assert.deepEqual(await tierFlags("runner"), []);
    assert.deepEqual(await tierFlags("memory"), []);
  });

  test("Ctrl-C stops every service and exits 0, also when a second signal follows at once", async () => {
    const children = (await run("pgrep", ["-P", String(up.pid)])).stdout.trim().split("\n").map(Number);
    assert.equal(children.length, 6, "model server and five services");
    await waitFor("the sandbox's pool", async () => (await sandboxContainers(dataDir)).length > 0);
    const exited = new Promise<number | null>((resolve) => up.once("exit", (code) => resolve(code)));
    // As `timeout make run` stops it: the process group's signal, and make's forward of it.
    up.kill("SIGINT");
    await new Promise((resolve) => setTimeout(resolve, 15));
    up.kill("SIGTERM");
    assert.equal(await exited, 0);
    assert.doesNotMatch(log(), /second signal/);
    assert.deepEqual(await sandboxContainers(dataDir), [], "the pool's containers are removed");
    for (const pid of children) assert.throws(() => process.kill(pid, 0), `child ${pid} is gone`);
    assert.match(log(), /all services stopped/);
    // Now nothing answers: status fails, and doctor says what to do.
    const doctor = spawnSync(process.execPath, [MAIN, "doctor", ...flagsFor(addr, dataDir)], { encoding: "utf8" });
    assert.equal(doctor.status, 1);
    assert.match(
      doctor.stdout,
      /^FAIL +gateway +127\.0\.0\.1:\d+ unreachable \(ECONNREFUSED\)\n +fix: start Troupe with `make run` or `troupe up`/m,
    );
    assert.match(doctor.stdout, /^ok +keys /m);
  });
});

describe("one service process", () => {
  test("SIGTERM: health goes NOT_SERVING, the server drains, the process exits 0", async () => {
    const port = await freePort();
    const proc = spawn(process.execPath, [MAIN, "router", "--router", `127.0.0.1:${port}`], { stdio: "ignore" });
    await waitServing(`127.0.0.1:${port}`, 20_000, SERVICE_TYPE.router);
    const health = createClient(Health, `127.0.0.1:${port}`);
    const watch = health.watch({ service: "troupe.v1.RouterService" });
    const seen: Serving[] = [];
    watch.on("data", (r) => seen.push(r.status));
    watch.on("error", () => undefined);
    await waitFor("the first health status", async () => seen.length > 0);
    const exited = new Promise<number | null>((resolve) => proc.once("exit", (code) => resolve(code)));
    proc.kill("SIGTERM");
    assert.equal(await exited, 0);
    health.close();
    assert.deepEqual(seen, [Serving.SERVING, Serving.NOT_SERVING]);
  });

  test("a router started alone starts over, same pid, on the interpreter; TROUPE_JIT=on keeps every tier", async () => {
    for (const [jit, want] of [
      [undefined, ["--max-opt=0"]],
      ["on", []],
    ] as const) {
      const env = { ...process.env };
      delete env.TROUPE_JIT;
      if (jit) env.TROUPE_JIT = jit;
      const port = await freePort();
      const proc = spawn(process.execPath, [MAIN, "router", "--router", `127.0.0.1:${port}`], { stdio: "ignore", env });
      try {
        await waitServing(`127.0.0.1:${port}`, 20_000, SERVICE_TYPE.router);
        const cmdline = (await readFile(`/proc/${proc.pid}/cmdline`, "utf8")).split("\0");
        assert.deepEqual(
          cmdline.filter((a) => a.startsWith("--max-opt")),
          want,
          `TROUPE_JIT=${jit}: ${cmdline.join(" ")}`,
        );
      } finally {
        const exited = new Promise((resolve) => proc.once("exit", resolve));
        proc.kill("SIGTERM");
        await exited;
      }
    }
  });

  test("a sandbox service given an engine address it cannot reach exits 1 naming DOCKER_HOST", async () => {
    const dataDir = await mkdtemp(path.join(os.tmpdir(), "troupe-engine-"));
    const port = await freePort();
    const res = await run(
      process.execPath,
      [MAIN, "sandbox", "--sandbox", `127.0.0.1:${port}`, "--data-dir", dataDir],
      {
        env: { ...process.env, DOCKER_HOST: "npipe:////./pipe/docker_engine" },
      },
    ).catch((e) => e);
    await rm(dataDir, { recursive: true, force: true });
    assert.equal(res.code, 1);
    assert.match(
      res.stderr,
      /failed to start: DOCKER_HOST=npipe:\/\/\/\/\.\/pipe\/docker_engine: Troupe reaches an engine at unix:\/\/\/path, tcp:\/\/host:port/,
    );
  });

  test("a service whose port is taken exits 1 saying so, and the port's owner answers health only for its own service", async () => {
    const port = await freePort();
    const at = `127.0.0.1:${port}`;
    const owner = spawn(process.execPath, [MAIN, "router", "--router", at], { stdio: "ignore" });
    try {
      await waitServing(at, 20_000, SERVICE_TYPE.router);
      const dataDir = await mkdtemp(path.join(os.tmpdir(), "troupe-port-"));
      const res = await run(process.execPath, [MAIN, "memory", "--memory", at, "--data-dir", dataDir]).catch((e) => e);
      await rm(dataDir, { recursive: true, force: true });
      assert.equal(res.code, 1);
      assert.match(res.stderr, new RegExp(`failed to start: ${at} is already in use by another process`));
      // What `troupe up` and the test stacks ask: by name, the memory service is not here.
      const health = createClient(Health, at);
      try {
        assert.equal((await health.check({ service: SERVICE_TYPE.router })).status, Serving.SERVING);
        await assert.rejects(
          health.check({ service: SERVICE_TYPE.memory }),
          (err: { code?: number }) => err.code === 5 /* NOT_FOUND */,
        );
      } finally {
        health.close();
      }
    } finally {
      owner.kill("SIGTERM");
    }
  });

  test("a bad flag is refused with a message and exit code 1", async () => {
    const res = await run(process.execPath, [MAIN, "router", "--max-message-bytes", "lots"]).catch((e) => e);
    assert.equal(res.code, 1);
    assert.match(res.stderr, /--max-message-bytes must be a positive integer/);
  });
});

describe("troupe chat", () => {
  let stack: Awaited<ReturnType<typeof startStack>>;
  before(async () => {
    stack = await startStack();
  });
  after(async () => {
    await stack?.stop();
  });

  test("with a message: streams the reply, shows tool activity, exits 0", async () => {
    const { stdout, stderr } = await troupeChat(stack, ["--session", "cli-1", "$ echo from-cli"]);
    assert.equal(stdout, "Tool results: from-cli [exit 0]\n");
    assert.match(stderr, /session cli-1/);
    assert.match(stderr, /\[tool exec\] \{"command":"echo from-cli"\}/);
    assert.match(stderr, /from-cli\n/);
    // The session keeps its history across invocations.
    await troupeChat(stack, ["--session", "cli-1", "second"]);
    const history = await stack.gateway.getHistory({ sessionId: "cli-1" });
    assert.equal(history.messages.at(-1)!.text, "You said: second");
  });

  test("--model picks the session's model among those its agent allows, and it stays chosen", async () => {
    const agentDir = path.join(stack.dataDir, "agents", "picker");
    await mkdir(agentDir, { recursive: true });
    await writeFile(path.join(agentDir, "agent.json"), JSON.stringify({ models: ["scripted-2"] }));
    const chat = (...args: string[]) => troupeChat(stack, args);
    const modelsOf = (stdout: string) =>
      stdout
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l) as { agentStart?: { model: string } })
        .filter((e) => e.agentStart)
        .map((e) => e.agentStart!.model);
    const base = ["--json", "--agent", "picker", "--session", "cli-model"];
    assert.deepEqual(modelsOf((await chat(...base, "--model", "scripted-2", "hello")).stdout), ["scripted-2"]);
    // Kept with the session: the next turn, without --model, uses it too.
    assert.deepEqual(modelsOf((await chat(...base, "again")).stdout), ["scripted-2"]);
    const history = await stack.gateway.getHistory({ sessionId: "cli-model" });
    assert.deepEqual(
      history.messages.filter((m) => m.role === Role.ASSISTANT).map((m) => m.model),
      ["scripted-2", "scripted-2"],
    );
    // One the agent does not allow: refused with the list, nothing sent, the session unchanged.
    const refused = await chat(...base, "--model", "scripted-9", "nope").catch((e) => e);
    assert.equal(refused.code, 1);
    assert.match(refused.stderr, /INVALID_ARGUMENT/);
    assert.match(
      refused.stderr,
      /model scripted-9 is not one agent picker allows \(it allows scripted-1, scripted-2\)/,
    );
    const fresh = await chat(
      "--json",
      "--agent",
      "picker",
      "--session",
      "cli-model-new",
      "--model",
      "scripted-9",
      "x",
    ).catch((e) => e);
    assert.equal(fresh.code, 1);
    assert.match(fresh.stderr, /INVALID_ARGUMENT/);
    const sessions = await stack.gateway.listSessions({});
    assert.ok(!sessions.sessions.some((x) => x.sessionId === "cli-model-new"), "a refused model makes no session");
    const malformed = await chat(...base, "--model", "not a model", "x").catch((e) => e);
    assert.equal(malformed.code, 1);
    assert.match(malformed.stderr, /model "not a model" is not valid/);
    assert.equal((await stack.gateway.getHistory({ sessionId: "cli-model" })).messages.length, 4);
  });

  test("a failed turn exits non-zero; an unreachable gateway says how to fix it", async () => {
    const failed = await troupeChat(stack, ["!fail 500"]).catch((e) => e);
    assert.equal(failed.code, 1);
    assert.match(failed.stderr, /MODEL_ERROR/);
    // Retries are shown as they wait, so a slow failure does not look like a hang.
    assert.match(failed.stderr, /\[scripted-1: [^\]]*; retry 1 in \d+\.\d s\]/);
    const port = await freePort();
    const down = await troupeChat({ ...stack, addr: { gateway: `127.0.0.1:${port}` } }, ["hi"]).catch((e) => e);
    assert.equal(down.code, 1);
    assert.match(down.stderr, /UNAVAILABLE/);
    assert.match(down.stderr, /make run/);
  });

  test("interactive: a line typed while the agent works is sent as steering", async () => {
    const proc = spawn(
      process.execPath,
      [MAIN, "chat", "-i", "--data-dir", stack.dataDir, "--gateway", stack.addr.gateway, "--session", "cli-steer"],
      { stdio: ["pipe", "pipe", "pipe"] },
    );
    let out = "";
    let err = "";
    proc.stdout!.on("data", (d) => (out += d));
    proc.stderr!.on("data", (d) => (err += d));
    await waitFor("the session to open", async () => err.includes("session cli-steer"));
    proc.stdin!.write("$$ sleep 1 ;; echo second\n");
    await waitFor("the first tool to start", async () => err.includes("[tool exec]"));
    proc.stdin!.write("stop please\n");
    await waitFor("the steered answer", async () => out.includes("You said: stop please"), 20_000);
    proc.stdin!.end();
    const code = await new Promise((resolve) => proc.once("exit", resolve));
    assert.equal(code, 0);
    assert.match(err, /\[steering: skipped 1 tool call\(s\)\]/);
  });

  test("interactive: a call held for approval is asked at the prompt; n with a reason rejects, y approves", async () => {
    await writeAgent(stack.dataDir, "guarded", { approvals: { tools: { manage_schedule: "ask" } } });
    const argv = [MAIN, "chat", "-i", "--data-dir", stack.dataDir, "--gateway", stack.addr.gateway];
    const proc = spawn(process.execPath, [...argv, "--agent", "guarded", "--session", "cli-approve"], {
      stdio: ["pipe", "pipe", "pipe"],
    });
    let out = "";
    let err = "";
    proc.stdout!.on("data", (d) => (out += d));
    proc.stderr!.on("data", (d) => (err += d));
    await waitFor("the session to open", async () => err.includes("session cli-approve"));
    const asking = '!call manage_schedule {"action": "list"}\n';
    proc.stdin!.write(asking);
    await waitFor("the question", async () => err.includes("[approval needed: manage_schedule"));
    proc.stdin!.write("n not now\n");
    await waitFor("the rejection's answer", async () => out.includes("Not run: dev rejected this call: not now"));
    proc.stdin!.write(asking);
    await waitFor("the second question", async () => err.split("[approval needed").length === 3);
    proc.stdin!.write("y\n");
    await waitFor("the approved call's answer", async () => out.includes("(no schedules)"), 20_000);
    proc.stdin!.end();
    const code = await new Promise((resolve) => proc.once("exit", resolve));
    assert.equal(code, 0);
    assert.match(err, /rejected by dev[\s\S]*approved by dev/);
  });

  test("piped stdin is one message; --instruction reaches the turn's prompt; a bad --queue-mode is refused", () => {
    const chat = (args: string[], input: string) =>
      spawnSync(
        process.execPath,
        [MAIN, "chat", "--data-dir", stack.dataDir, "--gateway", stack.addr.gateway, ...args],
        {
          input,
          encoding: "utf8",
          timeout: 30_000,
        },
      );
    const piped = chat(["--session", "cli-pipe"], "first line\nsecond line\n");
    assert.equal(piped.status, 0, piped.stderr);
    assert.equal(piped.stdout, "You said: first line\nsecond line\n");
    const empty = chat([], "");
    assert.equal(empty.status, 2);
    assert.match(empty.stderr, /nothing came on stdin/);
    const instructed = chat(["--instruction", "Answer like a ship's log.", "--queue-mode", "followup", "!system"], "");
    assert.equal(instructed.status, 0, instructed.stderr);
    assert.match(instructed.stdout, /Answer like a ship's log\./);
    const bad = chat(["--queue-mode", "later", "hi"], "");
    assert.equal(bad.status, 2);
    assert.match(bad.stderr, /--queue-mode must be one of steer, followup, collect, interrupt, reject, not "later"/);
  });

  test("troupe sessions and troupe schedules: the caller's own, as a table or JSON lines; mistakes exit non-zero", async () => {
    const troupe = (...args: string[]) =>
      run(process.execPath, [MAIN, ...args, "--data-dir", stack.dataDir, "--gateway", stack.addr.gateway]);
    const fails = (...args: string[]) =>
      troupe(...args).then(
        () => assert.fail(`troupe ${args.join(" ")} succeeded`),
        (e: { code: number; stderr: string }) => e,
      );
    const listed = (await troupe("sessions", "ls")).stdout;
    assert.match(listed, /^SESSION\s+AGENT\s+MESSAGES\s+UPDATED\s+STATE\n/);
    assert.match(listed, /\ncli-1\s+main\s+\d+\s+\d{4}-\d\d-\d\dT\S+\s+idle/);
    // A decision on a call nobody waits on: the gateway's NOT_FOUND, said, exit 1; a bad verdict is usage.
    const undecided = await fails("sessions", "decide", "cli-1", "call-1", "approve");
    assert.equal(undecided.code, 1);
    assert.match(undecided.stderr, /no tool call "call-1" waits for a decision/);
    assert.equal((await fails("sessions", "decide", "cli-1", "call-1", "maybe")).code, 2);
    const json = (await troupe("sessions", "ls", "--json")).stdout
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l));
    assert.ok(json.some((x) => x.sessionId === "cli-1" && x.agentId === "main"));
    assert.match(
      (await troupe("sessions", "show", "cli-1")).stdout,
      /\] user: second\n\[[^\]]+\] assistant: You said: second\n/,
    );

    const added = await troupe(
      "schedules",
      "add",
      "cli-1",
      "--cron",
      "0 9 * * *",
      "--tz",
      "Asia/Kolkata",
      "--id",
      "standup",
      "stand",
      "up",
    );
    assert.match(added.stdout, /^scheduled standup; next \d{4}-\d\d-\d\dT03:30:00Z\n$/);
    assert.match(
      (await troupe("schedules", "ls", "cli-1")).stdout,
      /\nstandup\s+cron "0 9 \* \* \*" Asia\/Kolkata\s+\S+T03:30:00Z\s+-\s+stand up\n/,
    );
    const badZone = await fails("schedules", "add", "cli-1", "--cron", "0 9 * * *", "--tz", "Mars/Olympus", "x");
    assert.deepEqual(
      [badZone.code, /INVALID_ARGUMENT: time_zone: "Mars\/Olympus" is not a time zone/.test(badZone.stderr)],
      [1, true],
    );
    assert.equal((await fails("schedules", "add", "cli-1", "x")).code, 2);
    assert.equal((await troupe("schedules", "rm", "cli-1", "standup")).stdout, "deleted standup\n");
    assert.match((await fails("schedules", "rm", "cli-1", "standup")).stderr, /no schedule standup in session cli-1/);

    const missing = await fails("sessions", "rm", "no-such-session");
    assert.deepEqual([missing.code, /NOT_FOUND/.test(missing.stderr)], [1, true]);
    const typo = await fails("sessions", "lsit");
    assert.deepEqual(
      [typo.code, /unknown sessions subcommand "lsit"; one of: ls, show, decide, rm/.test(typo.stderr)],
      [2, true],
    );
    assert.equal((await troupe("sessions", "rm", "cli-steer")).stdout.split(" (")[0].trim(), "deleted cli-steer");
    assert.doesNotMatch((await troupe("sessions", "ls")).stdout, /cli-steer/);
  });

  test("troupe chat --json prints every event as a JSON line; -c continues the session used last", async () => {
    const chat = (...args: string[]) => troupeChat(stack, args);
    const { stdout } = await chat("--json", "--session", "cli-json", "hello json");
    const events = stdout
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l));
    assert.ok(events.every((e) => e.sessionId === "cli-json" && typeof e.seq === "string"));
    assert.ok(events.some((e) => typeof e.messageUpdate?.text === "string"));
    assert.equal(events.find((e) => e.agentEnd).agentEnd.stopReason, "STOP_REASON_COMPLETED");
    const again = await chat("-c", "and again");
    assert.match(again.stderr, /session cli-json\n/);
    assert.equal(again.stdout, "You said: and again\n");
  });
});

describe("a gateway stopped with a stream still open", () => {
  let stack: Awaited<ReturnType<typeof startStack>>;
  before(async () => {
    stack = await startStack({ env: { TROUPE_DRAIN_GRACE_MS: "300" } });
  });
  after(() => stack?.stop());

  test("ends it UNAVAILABLE, to retry, not as if the client had cancelled", async () => {
    const s = new ChatSession(stack.gateway);
    s.open();
    // A turn that outlasts the drain's grace: 2,000 tokens at 20 a second.
    s.prompt("!bench 2000 rate=20");
    await s.waitFor((e) => e.payload.case === "messageUpdate", 20_000);
    assert.equal(await stack.kill("gateway", "SIGTERM"), 0);
    await s.until(() => s.status !== undefined, 10_000).catch(() => undefined);
    assert.equal(s.status?.code, Status.UNAVAILABLE, `${s.status?.code} ${s.status?.details}`);
    assert.match(s.status?.details ?? "", /shutting down; retry/);
  });
});
