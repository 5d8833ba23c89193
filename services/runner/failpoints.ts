// Failpoints: named places where the code can be told to fail, to test how the rest of the system
// copes with a bug there. Off unless TROUPE_FAILPOINTS names them (comma-separated):
//   NAME          fail every time the code passes NAME
//   NAME=TEXT     fail when the subject given at NAME contains TEXT
// Places: runner.run (subject: the text that starts the run).
const configured = new Map<string, string | undefined>();

/** Sets the failpoints from their configuration (TROUPE_FAILPOINTS); the runner calls it at start. */
export function configureFailpoints(spec: string): void {
  configured.clear();
  for (const item of spec.split(",")) {
    const [name, match] = item.split("=", 2).map((s) => s.trim());
    if (name) configured.set(name, match || undefined);
  }
}

export class FailpointError extends Error {}

export function failpoint(name: string, subject = ""): void {
  if (!configured.has(name)) return;
  const match = configured.get(name);
  if (match === undefined || subject.includes(match)) throw new FailpointError(`failpoint ${name} triggered`);
}
