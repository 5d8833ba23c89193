// Failpoints: named places where the code can be told to fail, to test how the rest of the system
// copes with a bug there. Off unless TROUPE_FAILPOINTS names them (comma-separated):
//   NAME          fail every time the code passes NAME
//   NAME=TEXT     fail when the subject given at NAME contains TEXT
//   ...!crash     instead of failing, the process dies there at once (SIGKILL), as in a crash
// Places: runner.run (subject: the text that starts the run); runner.delete (subject: the session
// id; between a deleted session's removal and its sub-agents').
const configured = new Map<string, { match?: string; crash: boolean }>();

/** Sets the failpoints from their configuration (TROUPE_FAILPOINTS); the runner calls it at start. */
export function configureFailpoints(spec: string): void {
  configured.clear();
  for (const item of spec.split(",")) {
    const crash = item.trim().endsWith("!crash");
    const [name, match] = item
      .trim()
      .replace(/!crash$/, "")
      .split("=", 2)
      .map((s) => s.trim());
    if (name) configured.set(name, { match: match || undefined, crash });
  }
}

export class FailpointError extends Error {}

export function failpoint(name: string, subject = ""): void {
  const point = configured.get(name);
  if (!point || (point.match !== undefined && !subject.includes(point.match))) return;
  if (point.crash) process.kill(process.pid, "SIGKILL");
  throw new FailpointError(`failpoint ${name} triggered`);
}
