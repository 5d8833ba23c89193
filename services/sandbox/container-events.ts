// The engine's event stream for one deployment's sandboxes: OOM kills are counted (a command's
// exit reports them), and every container's end is passed on (the fleet forgets it, and says so
// when nobody asked for it).
import type { Readable } from "node:stream";
import type { Engine } from "./engine.js";

/** A container ended: its id, name, the exit code the engine reported ("" if none), its scope label. */
export interface ContainerDeath {
  id: string;
  name: string;
  exitCode: string;
  /** The `troupe.scope` label: set on a sandbox made for its key, absent on a pooled one. */
  scope: string;
}

export class ContainerEvents {
  /** OOM kills the engine reported, by container id. */
  private readonly oomKills = new Map<string, number>();
  /** The stream while it lasts; `subscribing` while one is being asked for. */
  private stream: Readable | undefined;
  private subscribing: Promise<void> | undefined;
  private closed = false;

  constructor(
    private readonly docker: Engine,
    private readonly instance: string,
    private readonly died: (death: ContainerDeath) => void,
  ) {}

  /**
   * Subscribes if there is no stream; call once the engine answers, and again from time to time:
   * a stream the engine ended (it restarted) is replaced, a live one kept.
   */
  watch(): Promise<void> {
    if (this.stream || this.closed) return Promise.resolve();
    this.subscribing ??= this.subscribe().finally(() => (this.subscribing = undefined));
    return this.subscribing;
  }

  ooms(containerId: string): number {
    return this.oomKills.get(containerId) ?? 0;
  }

  /** Drops a removed container's count. */
  forget(containerId: string): void {
    this.oomKills.delete(containerId);
  }

  close(): void {
    this.closed = true;
    this.stream?.destroy();
  }

  private async subscribe(): Promise<void> {
    let stream: Readable;
    try {
      stream = await this.docker.events({
        type: ["container"],
        event: ["oom", "die"],
        label: [`troupe.instance=${this.instance}`],
      });
    } catch {
      return;
    }
    if (this.closed) return void stream.destroy();
    this.stream = stream;
    // One JSON object per line; a line may come in two chunks, so the unfinished end waits.
    let partial = "";
    stream.on("data", (chunk: Buffer) => {
      const lines = (partial + chunk.toString("utf8")).split("\n");
      partial = lines.pop() ?? "";
      for (const line of lines) if (line.trim()) this.take(line);
    });
    stream.on("error", () => undefined);
    stream.on("close", () => {
      if (this.stream === stream) this.stream = undefined;
    });
  }

  private take(line: string): void {
    let ev: { Action?: string; Actor?: { ID?: string; Attributes?: Record<string, string> } };
    try {
      ev = JSON.parse(line);
    } catch {
      return; // not an event: nothing to act on
    }
    const id = ev.Actor?.ID ?? "";
    const attributes = ev.Actor?.Attributes ?? {};
    if (ev.Action === "oom") this.oomKills.set(id, this.ooms(id) + 1);
    if (ev.Action === "die")
      this.died({
        id,
        name: attributes.name ?? "",
        exitCode: attributes.exitCode ?? "",
        scope: attributes["troupe.scope"] ?? "",
      });
  }
}
