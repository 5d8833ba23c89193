// `make lint`'s check that no container engine in the manifests listens on TCP. A Docker engine
// (dockerd, the docker:*-dind image) with a TCP API is root on its node for whoever reaches the
// port. The check reads each container's command line as rendered and as the image's entrypoint
// would run it: docker's dind entrypoint (dockerd-entrypoint.sh, https://hub.docker.com/_/docker)
// starts `dockerd --host=unix://... --host=tcp://0.0.0.0:2376` (2375 without TLS) when it is given
// no arguments or arguments starting with `-`, before whatever was given.

interface Container {
  name?: string;
  image?: string;
  command?: string[];
  args?: string[];
}

const DIND_IMAGE = /(^|\/)docker:[^/]*dind/;

/** The command line the container runs: command (else the image's entrypoint), then args. */
function commandLine(c: Container): string[] {
  const entrypoint = c.command ?? (DIND_IMAGE.test(c.image ?? "") ? ["dockerd-entrypoint.sh"] : []);
  return [...entrypoint, ...(c.args ?? [])];
}

/** Why this container's engine would listen on TCP, or undefined when it would not. */
export function tcpListener(c: Container): string | undefined {
  let argv = commandLine(c);
  if (argv.length > 0 && argv[0].endsWith("dockerd-entrypoint.sh")) {
    const rest = argv.slice(1);
    if (rest.length === 0 || rest[0].startsWith("-"))
      return "dockerd-entrypoint.sh given no command, or flags first, adds --host=tcp://0.0.0.0:2376: set `command:` to start with dockerd";
    argv = rest;
  }
  const runsDockerd = argv.some((a) => /(^|\/)dockerd$/.test(a));
  if (!runsDockerd) return undefined;
  for (const [i, a] of argv.entries()) {
    const host = a.startsWith("--host=") || a.startsWith("-H=") ? a.slice(a.indexOf("=") + 1) : undefined;
    const next = a === "--host" || a === "-H" ? argv[i + 1] : undefined;
    const value = host ?? next;
    if (value !== undefined && !value.startsWith("unix://") && !value.startsWith("fd://"))
      return `dockerd is told to listen on ${value}`;
  }
  return undefined;
}

/** Every container of a rendered object (pods, workloads, their init containers) that listens on TCP. */
export function engineListenerProblems(doc: unknown): string[] {
  const o = doc as { kind?: string; metadata?: { name?: string; namespace?: string }; spec?: Record<string, unknown> };
  const podSpec = (
    o.kind === "Pod" ? o.spec : (o.spec?.template as { spec?: Record<string, unknown> } | undefined)?.spec
  ) as { containers?: Container[]; initContainers?: Container[] } | undefined;
  if (!podSpec) return [];
  const where = `${o.kind} ${o.metadata?.namespace ?? ""}/${o.metadata?.name ?? ""}`;
  const problems: string[] = [];
  for (const c of [...(podSpec.initContainers ?? []), ...(podSpec.containers ?? [])]) {
    const why = tcpListener(c);
    if (why) problems.push(`${where} container ${c.name}: ${why}`);
  }
  return problems;
}
