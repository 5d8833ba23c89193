// The agent's stderr: diagnostics only, and written by code inside an untrusted sandbox, so every
// line is escaped and bounded before it reaches a log, and a sandbox gets a fixed number of lines
// per window (a flood is counted, not logged).

/** Diagnostics lines from one sandbox: this many per window, longer lines cut. */
const DIAGNOSTICS_PER_WINDOW = 20;
const DIAGNOSTICS_WINDOW_MS = 10_000;
const DIAGNOSTICS_MAX_CHARS = 300;

/** A diagnostics line as it may reach a log: control characters escaped, cut at a bound. */
export function escapeDiagnostic(line: string): string {
  const escaped = line.replace(
    /[\u0000-\u001f\u007f-\u009f\u2028\u2029]/g,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`,
  );
  return escaped.length > DIAGNOSTICS_MAX_CHARS
    ? `${escaped.slice(0, DIAGNOSTICS_MAX_CHARS)}... (${escaped.length} characters)`
    : escaped;
}

/** One sandbox's stderr, passed on to `emit` escaped and at most DIAGNOSTICS_PER_WINDOW lines per window. */
export class AgentDiagnostics {
  private window = { start: 0, lines: 0, dropped: 0 };

  constructor(private readonly emit: (line: string) => void) {}

  report(text: string): void {
    const now = Date.now();
    if (now - this.window.start >= DIAGNOSTICS_WINDOW_MS) {
      if (this.window.dropped > 0) this.emit(`(${this.window.dropped} more lines dropped)`);
      this.window = { start: now, lines: 0, dropped: 0 };
    }
    for (const line of text.trimEnd().split("\n")) {
      if (line === "") continue;
      if (this.window.lines >= DIAGNOSTICS_PER_WINDOW) this.window.dropped++;
      else {
        this.window.lines++;
        this.emit(escapeDiagnostic(line));
      }
    }
  }
}
