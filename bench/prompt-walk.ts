// bench/prompt-walk: the source files one prompt runs code in, measured instead of traced by hand
// (docs/architecture.md walks the same path). Every service runs as its own process under V8's
// precise coverage, read over each process's inspector (the Chrome DevTools protocol). After a
// warm-up session, the counters are reset and three windows are taken on a new Chat stream: the
// open (to the opened answer), the prompt to its first token on the client, and the rest of the
// run to agent_end. A file counts in a window when a function in it ran there that did not also
// run in an idle window of the same length before it: lease renewals, timers and the like are
// the processes' own, not the prompt's (a logging helper both use is left out with them).
// Generated protobuf code holds descriptors only; no function of it runs.
//
//   node dist/bench/prompt-walk.js [--list] [--functions]
import { parseArgs } from "node:util";
import { freePort } from "../services/cli/free-port.js";
import { ChatSession } from "../test/helpers/session.js";
import { SERVICE_ORDER, startStack, type Stack } from "../test/helpers/stack.js";

const { values } = parseArgs({
  options: {
    /** Name each file of each window. */
    list: { type: "boolean", default: false },
    /** With --list: the functions that ran in each file, and how often. */
    functions: { type: "boolean", default: false },
  },
});
const IDLE_MS = 6_000;

/** One process's inspector over its WebSocket. */
class Inspector {
  private n = 0;
  private readonly waiting = new Map<number, (msg: { result?: unknown; error?: { message: string } }) => void>();
  private constructor(private readonly ws: WebSocket) {
    ws.addEventListener("message", (e) => {
      const msg = JSON.parse(String(e.data));
      this.waiting.get(msg.id)?.(msg);
      this.waiting.delete(msg.id);
    });
    // A process that died fails the bench instead of leaving it waiting for an answer.
    ws.addEventListener("close", () => {
      for (const answer of this.waiting.values()) answer({ error: { message: "the inspector's connection closed" } });
      this.waiting.clear();
    });
  }

  static async connect(port: number): Promise<Inspector> {
    const targets = (await (await fetch(`http://127.0.0.1:${port}/json/list`)).json()) as {
      webSocketDebuggerUrl: string;
    }[];
    const ws = new WebSocket(targets[0].webSocketDebuggerUrl);
    await new Promise((resolve, reject) => {
      ws.addEventListener("open", resolve, { once: true });
      ws.addEventListener("error", reject, { once: true });
    });
    return new Inspector(ws);
  }

  send<T>(method: string, params: object = {}): Promise<T> {
    const id = ++this.n;
    this.ws.send(JSON.stringify({ id, method, params }));
    return new Promise((resolve, reject) =>
      this.waiting.set(id, (msg) => (msg.error ? reject(new Error(msg.error.message)) : resolve(msg.result as T))),
    );
  }

  close(): void {
    this.ws.close();
  }
}

interface Coverage {
  result: { url: string; functions: { functionName: string; ranges: { startOffset: number; count: number }[] }[] }[];
}

/** What ran in one window: "process services/x.ts" -> function (name@offset) -> calls. */
type Ran = Map<string, Map<string, number>>;

/** Reads every process's counters since its last take, and resets them. */
async function takeAll(inspectors: Map<string, Inspector>): Promise<Ran> {
  const ran: Ran = new Map();
  for (const [process, inspector] of inspectors) {
    const { result } = await inspector.send<Coverage>("Profiler.takePreciseCoverage");
    for (const script of result) {
      const at = script.url.indexOf("/dist/services/");
      if (at < 0) continue;
      const fns = new Map<string, number>();
      for (const f of script.functions) {
        const { startOffset, count } = f.ranges[0];
        if (count > 0) fns.set(`${f.functionName || "(anonymous)"}@${startOffset}`, count);
      }
      if (fns.size > 0) ran.set(`${process} ${script.url.slice(at + "/dist/".length).replace(/\.js$/, ".ts")}`, fns);
    }
  }
  return ran;
}

/** Adds `fns`' calls to `file`'s in `into`. */
function addCalls(into: Map<string, Map<string, number>>, file: string, fns: Iterable<[string, number]>): void {
  const calls = into.get(file) ?? new Map<string, number>();
  for (const [fn, n] of fns) calls.set(fn, (calls.get(fn) ?? 0) + n);
  into.set(file, calls);
}

/** The files of `window` in which something ran that did not run while idle. */
function beyond(window: Ran, idle: Ran): Map<string, Map<string, number>> {
  const out = new Map<string, Map<string, number>>();
  for (const [key, fns] of window) {
    const own = [...fns].filter(([fn]) => !idle.get(key)?.has(fn));
    if (own.length > 0) addCalls(out, key.slice(key.indexOf(" ") + 1), own);
  }
  return out;
}

function report(what: string, files: Map<string, Map<string, number>>): number {
  const rooms = new Map<string, number>();
  for (const f of files.keys()) {
    const room = f.split("/").slice(1, -1).join("/");
    rooms.set(room, (rooms.get(room) ?? 0) + 1);
  }
  const by = [...rooms].map(([room, n]) => `${room} ${n}`).join(", ");
  console.log(`${what}: ${files.size} files (${by})`);
  if (values.list)
    for (const [f, fns] of [...files].sort(([a], [b]) => a.localeCompare(b)))
      console.log(
        `  ${f}${values.functions ? `: ${[...fns].map(([fn, n]) => `${fn.slice(0, fn.lastIndexOf("@"))} x${n}`).join(", ")}` : ""}`,
      );
  return files.size;
}

const stack: Stack = await startStack({ services: ["model-server"] });
const inspectors = new Map<string, Inspector>();
try {
  for (const name of SERVICE_ORDER.filter((s) => s !== "model-server")) {
    const port = await freePort();
    await stack.startInstance(name, name, {
      addr: stack.addr[name],
      env: { NODE_OPTIONS: `--inspect=127.0.0.1:${port}` },
    });
    const inspector = await Inspector.connect(port);
    await inspector.send("Profiler.enable");
    await inspector.send("Profiler.startPreciseCoverage", { callCount: true, detailed: false });
    inspectors.set(name, inspector);
  }

  // Warm-up: a session of its own, opened and prompted twice, so that what runs once in a
  // process's life (a first connection, a module loaded late) is not counted as the prompt's.
  const warm = new ChatSession(stack.gateway);
  warm.open();
  await warm.waitOpened(30_000);
  for (let i = 0; i < 2; i++) await warm.turn("!tokens 3", 30_000);
  warm.close();
  await new Promise((r) => setTimeout(r, 1_000));
  await takeAll(inspectors);
  await new Promise((r) => setTimeout(r, IDLE_MS));
  const idle = await takeAll(inspectors);

  const chat = new ChatSession(stack.gateway);
  chat.open();
  await chat.waitOpened(30_000);
  const open = await takeAll(inspectors);
  // Three tokens half a second apart: the first token's window closes before the second is sent.
  const from = chat.events.length;
  chat.prompt("!tokens 3 rate=2");
  await chat.waitFor((e) => e.payload.case === "messageUpdate", 30_000, from);
  const toFirst = await takeAll(inspectors);
  await chat.waitFor((e) => e.payload.case === "agentEnd", 30_000, from);
  const rest = await takeAll(inspectors);
  chat.close();

  const openFiles = report("the open", beyond(open, idle));
  const firstFiles = beyond(toFirst, idle);
  report("the prompt, to its first token on the client", firstFiles);
  const restFiles = beyond(rest, idle);
  report("the rest of its run, to agent_end", restFiles);
  const whole = new Map<string, Map<string, number>>();
  for (const [f, fns] of [...firstFiles, ...restFiles]) addCalls(whole, f, fns);
  const promptFiles = report("the prompt, whole", whole);
  console.log(`RESULT prompt_files=${promptFiles} to_first_token_files=${firstFiles.size} open_files=${openFiles}`);
} finally {
  for (const inspector of inspectors.values()) inspector.close();
  await stack.stop();
}
