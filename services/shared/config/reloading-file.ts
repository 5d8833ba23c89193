// A configuration file that is read again when it changes, so operators can add API keys or
// change routing without a restart. A file that stops parsing keeps the last good value (and the
// error is reported); a file that disappears means the empty value.
import { readFile, stat } from "node:fs/promises";

export class ReloadingFile<T> {
  private mtime = -1;
  private current: T;
  private timer?: NodeJS.Timeout;

  constructor(
    readonly path: string,
    private readonly parse: (text: string, source: string) => T,
    private readonly empty: T,
    /** Called with the new value after each change that parsed. */
    private readonly onChange: (value: T) => void = () => undefined,
  ) {
    this.current = empty;
  }

  get value(): T {
    return this.current;
  }

  /** Reads the file if it changed since the last read; throws if the new text does not parse. */
  async reload(): Promise<void> {
    const mtime = await stat(this.path).then(
      (s) => s.mtimeMs,
      () => 0,
    );
    if (mtime === this.mtime) return;
    const next = mtime === 0 ? this.empty : this.parse(await readFile(this.path, "utf8"), this.path);
    this.mtime = mtime;
    this.current = next;
    this.onChange(next);
  }

  /** Checks every intervalMs until stop(). */
  watch(intervalMs: number, onError: (err: unknown) => void): void {
    this.timer = setInterval(() => this.reload().catch(onError), intervalMs);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
  }
}
