#!/usr/bin/env node
// troupe: one binary for every service, the supervisor and the chat client.
import { readFileSync } from "node:fs";
import { childEnvironment, loadConfig, widenThreadPool } from "../shared/config/config.js";
import { exitProcess } from "../shared/process/exit.js";
import { runService } from "../shared/process/service.js";
import { startOver } from "./allocator.js";
import { jitFlags } from "./jit.js";
import { SERVICES } from "./service-starters.js";
import { CHANNEL_ADAPTERS } from "../adapter/registry.js";

const USAGE = `usage: troupe <command> [flags]

services (one process each):
  serve gateway|router|runner|memory|sandbox   (or: troupe gateway, troupe router, ...)
  model-server [--token-rate R] [--https-cert FILE --https-key FILE]
                        the scripted OpenAI-compatible model server: plain HTTP/1.1,
                        or HTTPS offering h2 and http/1.1 (docs/scripted-model.md)
all at once:
  up [--runners N] [--gateways M] [--routers R] [--store files|postgres] [--one-process]
                        start all five services (and the scripted model when no
                        OPENAI_BASE_URL is set), restart any that crash, stop on Ctrl-C;
                        N, M, R instances for a local cluster; --store postgres runs a
                        PostgreSQL server in DATA_DIR/postgres; what runs: DATA_DIR/up.json;
                        --one-process: all in this process (each on its port), less memory
client:
  chat [--session ID | -c] [--agent A] [--model P/M] [--json] [--instruction TEXT] [--queue-mode M]
       [-i] [--tls] [--ca FILE] [MESSAGE]
                        stream a reply; with MESSAGE (or what is piped in, as one
                        message) run one turn and exit; -c: the session used last;
                        --json: each event as a JSON line; --instruction: for the
                        turn's system prompt only; --queue-mode steer|followup|
                        collect|interrupt|reject; --model: the session's model from
                        now on (its agent.json "models"); -i: type lines even from a pipe;
                        --tls (system roots) or --ca FILE for a gateway serving TLS
  sessions ls | show ID | rm ID [--forget-memories]
                        your sessions; one's history and the calls it waits on; delete one
                        (--json: JSON lines)
  sessions decide ID CALL approve | reject [--message M] | edit --args JSON [--principal P]
                        decide on a tool call a session holds for approval (--principal: an
                        approver key deciding in another principal's session)
  mcp ls --agent NAME [--session ID]
                        the agent's MCP servers, their state and tools (exit 1 if one fails)
  schedules ls SESSION | rm SESSION ID
  schedules add SESSION (--cron EXPR [--tz ZONE] | --every SECONDS) [--id ID] TEXT
                        a session's scheduled turns (cron in an IANA time zone, or a heartbeat)
  --version             print the version
channels:
  adapter webhook|telegram|slack [--state FILE] [--listen HOST:PORT] [--reply-url URL] [--channel NAME]
                        a channel adapter under an adapter key (TROUPE_API_KEY): webhook takes
                        signed POSTs and POSTs replies (TROUPE_WEBHOOK_SECRET); telegram polls
                        the Bot API (TELEGRAM_BOT_TOKEN); slack takes the Events API
                        (SLACK_BOT_TOKEN, SLACK_SIGNING_SECRET); docs/channels.md
  pairing ls | approve CODE | reject CODE | revoke SENDER_ID [--adapter KIND]
                        who may write to the agent in private (TROUPE_ADAPTER_DM_POLICY=pairing):
                        the strangers waiting with their codes; let one in, or not
operations:
  status                each service's health, the HTTP address, the model endpoint,
                        configured models a provider retires or does not serve (a warning),
                        Docker and runsc, the sandbox image, the keys, the data directory;
                        exit 0 only if all is well
  doctor                the same, with what to do about each problem
  logs [-f] [--service S] [-n N]
                        what the services of \`troupe up\` wrote (DATA_DIR/logs)
  memory add|search|forget|stats|reembed
                        store, find (--debug: stage scores) and delete memories
  keys create --tenant T --principal P [--role user|adapter|approver|admin] [--channel C]... [--name N]
                        add an API key (printed once; only its hash is kept)
  keys ls | keys revoke NAME
                        list the keys (never the keys themselves); revoke one
  config                every environment variable Troupe reads, with its value (secrets masked)
  config validate FILE [--kind agent|routing|api-keys|quotas|providers]
                        check an agent.json, routing, keys, quotas or providers file
  config schema KIND    print that file's JSON Schema
  store migrate | status
                        bring the PostgreSQL store's schema up to date, or say where it is
  sandbox ls | exec --session ID -- CMD... | rm --session ID
                        list sandboxes, run a command in one, remove one
  sandbox snapshot SESSION | snapshots | restore SNAPSHOT --session ID | snapshot-rm SNAPSHOT
                        keep a session's workspace, list, start a session from one, delete

flags (also as environment variables):
  --data-dir DIR        TROUPE_DATA_DIR (default ./data)
  --store-url URL       TROUPE_STORE_URL: postgres://... (default: files in DATA_DIR)
  --gateway|--router|--runner|--memory|--sandbox HOST:PORT
                        TROUPE_<NAME>_ADDR (defaults 127.0.0.1:50051..50055)
  --model-server HOST:PORT  TROUPE_MODEL_SERVER_ADDR (default 127.0.0.1:50060)
  --max-message-bytes N TROUPE_MAX_MESSAGE_BYTES (default 4194304)
  --api-keys FILE       TROUPE_API_KEYS_FILE (default DATA_DIR/auth/api-keys.json)
  --tls-cert FILE --tls-key FILE
                        TROUPE_TLS_CERT, TROUPE_TLS_KEY: the gateway serves TLS (files
                        read again every 5 s, so a renewed certificate needs no restart)
credentials: TROUPE_API_KEY (clients; else DATA_DIR/auth/dev-key, made by troupe up),
  TROUPE_INTERNAL_TOKEN (between services; else DATA_DIR/auth/internal-token)
model: OPENAI_BASE_URL, OPENAI_API_KEY, TROUPE_MODEL; tracing: OTEL_EXPORTER_OTLP_ENDPOINT and the other OTEL_* (docs/settings.md)
`;

/** Subcommands of the commands that have them, for checking and suggestions. */
const SUBCOMMANDS: Record<string, string[]> = {
  memory: ["add", "search", "forget", "stats", "reembed"],
  config: ["validate", "schema"],
  keys: ["create", "ls", "revoke"],
  sandbox: ["ls", "exec", "rm", "snapshot", "snapshots", "restore", "snapshot-rm"],
  store: ["migrate", "status"],
  sessions: ["ls", "show", "decide", "rm"],
  mcp: ["ls"],
  schedules: ["ls", "add", "rm"],
  adapter: Object.keys(CHANNEL_ADAPTERS),
  pairing: ["ls", "approve", "reject", "revoke"],
};
const COMMANDS = [
  "gateway",
  "router",
  "runner",
  "memory",
  "sandbox",
  "model-server",
  "serve",
  "up",
  "chat",
  "adapter",
  "pairing",
  "sessions",
  "mcp",
  "schedules",
  "keys",
  "status",
  "doctor",
  "logs",
  "config",
  "store",
  "help",
  "version",
];

/** Levenshtein distance, for "did you mean". */
function distance(a: string, b: string): number {
  const row = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    let prev = row[0];
    row[0] = i;
    for (let j = 1; j <= b.length; j++) {
      const next = Math.min(row[j] + 1, row[j - 1] + 1, prev + (a[i - 1] === b[j - 1] ? 0 : 1));
      prev = row[j];
      row[j] = next;
    }
  }
  return row[b.length];
}

/** An unknown word's message: the closest known one when it is close, else the list. Exit code 2. */
function unknown(what: string, word: string, known: string[]): number {
  const best = known.map((k) => ({ k, d: distance(word, k) })).sort((x, y) => x.d - y.d)[0];
  const hint =
    best && best.d <= Math.max(1, Math.floor(word.length / 3))
      ? `did you mean "${best.k}"?`
      : `one of: ${known.join(", ")}`;
  process.stderr.write(`troupe: unknown ${what} "${word}"; ${hint}\n(troupe --help lists every command)\n`);
  return 2;
}

/** The lines of the usage that document `command`, for `troupe <command> --help`. */
function usageOf(command: string): string {
  const lines = USAGE.split("\n");
  const out: string[] = [];
  for (let i = 0; i < lines.length; i++) {
    const words = lines[i].trim().split(/[\s|]+/);
    if (!words.includes(command) || !lines[i].startsWith("  ") || lines[i].startsWith("   ")) continue;
    out.push(lines[i]);
    while (lines[i + 1]?.startsWith("    ")) out.push(lines[++i]);
  }
  const flags = USAGE.slice(USAGE.indexOf("flags (also"));
  return `usage: troupe ${command} ...\n\n${out.join("\n")}\n\n${flags}`;
}

async function main(argv: string[]): Promise<void> {
  let [command, ...args] = argv;
  if (!command || command === "help" || command === "--help" || command === "-h") {
    process.stdout.write(USAGE);
    return;
  }
  if (command === "--version" || command === "-V" || command === "version") {
    const pkg = JSON.parse(readFileSync(new URL("../../../package.json", import.meta.url), "utf8")) as {
      version: string;
    };
    process.stdout.write(`troupe ${pkg.version}\n`);
    return;
  }
  // `troupe serve <service>` is the same as `troupe <service>`.
  if (command === "serve") {
    const service = args.shift() ?? "";
    if (!(service in SERVICES) && service !== "model-server")
      return void (process.exitCode = unknown("service", service, [...Object.keys(SERVICES), "model-server"]));
    command = service;
  }
  if (args.includes("--help") || args.includes("-h")) {
    process.stdout.write(usageOf(command === "model-server" ? "model-server" : command));
    return;
  }
  if (!COMMANDS.includes(command)) {
    process.exitCode = unknown("command", command, COMMANDS);
    return;
  }
  // A word after a command is a subcommand: an unknown one is an error, never a server started
  // with it ignored (`troupe memory lsit` used to start the memory service).
  const sub = args[0];
  if (sub !== undefined && !sub.startsWith("-") && command in SUBCOMMANDS && !SUBCOMMANDS[command].includes(sub)) {
    process.exitCode = unknown(`${command} subcommand`, sub, SUBCOMMANDS[command]);
    return;
  }
  if (command in SERVICES && !(command in SUBCOMMANDS) && sub !== undefined && !sub.startsWith("-")) {
    process.stderr.write(`troupe: the ${command} service takes flags only, not "${sub}" (troupe ${command} --help)\n`);
    process.exitCode = 2;
    return;
  }
  if (command === "memory" && SUBCOMMANDS.memory.includes(args[0] ?? "")) {
    process.exitCode = await (await import("./memory.js")).memoryCommand(args);
    return;
  }
  if (command === "config") {
    process.exitCode = await (await import("./config.js")).configCommand(args);
    return;
  }
  if (command === "store") {
    process.exitCode = await (await import("./store.js")).storeCommand(args);
    return;
  }
  if (command === "sessions" || command === "schedules") {
    if (!SUBCOMMANDS[command].includes(sub ?? ""))
      return void (process.exitCode = unknown(`${command} subcommand`, sub ?? "", SUBCOMMANDS[command]));
    const cli = await import("./sessions.js");
    process.exitCode = await (command === "sessions" ? cli.sessionsCommand(args) : cli.schedulesCommand(args));
    return;
  }
  if (command === "mcp") {
    if (!SUBCOMMANDS.mcp.includes(sub ?? ""))
      return void (process.exitCode = unknown("mcp subcommand", sub ?? "", SUBCOMMANDS.mcp));
    process.exitCode = await (await import("./mcp.js")).mcpCommand(args);
    return;
  }
  if (command === "adapter") {
    if (!SUBCOMMANDS.adapter.includes(sub ?? ""))
      return void (process.exitCode = unknown("adapter", sub ?? "", SUBCOMMANDS.adapter));
    process.exitCode = await (await import("./adapter.js")).adapterCommand(args);
    return;
  }
  if (command === "status" || command === "doctor") {
    process.exitCode = await (await import("./status.js")).statusCommand(args, command === "doctor");
    return;
  }
  if (command === "logs") {
    process.exitCode = await (await import("./logs.js")).logsCommand(args);
    return;
  }
  if (command === "pairing") {
    process.exitCode = await (await import("./pairing.js")).pairingCommand(args);
    return;
  }
  if (command === "keys") {
    process.exitCode = await (await import("./keys.js")).keysCommand(args);
    return;
  }
  if (command === "sandbox" && SUBCOMMANDS.sandbox.includes(args[0] ?? "")) {
    process.exitCode = await (await import("./sandbox.js")).sandboxCommand(args);
    return;
  }
  if (command in SERVICES) {
    widenThreadPool();
    const cfg = loadConfig(args);
    startOver(cfg.allocator, childEnvironment(), jitFlags(command, cfg.jit));
    await runService(command, cfg, await SERVICES[command]());
    return;
  }
  switch (command) {
    case "model-server":
      return (await import("../dev/model-server-command.js")).modelServerCommand(args);
    case "up":
      return (await import("./up/command.js")).upCommand(args);
    case "chat":
      process.exitCode = await (await import("./chat.js")).chatCommand(args);
      return;

    default:
      process.stderr.write(`troupe: unknown command "${command}"\n\n${USAGE}`);
      process.exitCode = 2;
  }
}

main(process.argv.slice(2)).catch((err: Error) => {
  process.stderr.write(`troupe: ${err.message}\n`);
  void exitProcess(1);
});
