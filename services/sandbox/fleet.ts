// The sandbox containers of one deployment: made hardened, kept warm in a pool, claimed by a
// scope key (a session, an agent, or everyone), reaped when idle, old or dead.
//
// A pooled container is tenant-neutral: same image and settings as any other, nothing of a
// session in it. A claim renames it to its key's name and tells its agent whom it serves, and it
// is never handed to another key: released or reaped, it is removed. Docker labels cannot change
// after creation, so a claimed pool container carries its key in its name (a hash) and in its
// agent; one created for a key directly also has the key in its labels.
import { randomBytes } from "node:crypto";
import type { Container, Engine } from "./engine.js";
import { failedPrecondition } from "../shared/errors.js";
import type { Logger } from "../shared/process/log.js";
import { AgentConnection, type AttachOptions } from "./agent-connection.js";
import type { AgentSocket } from "./agent-socket.js";
import { type ContainerDeath, ContainerEvents } from "./container-events.js";
import { configHash, containerName, containerSpec, poolPrefix, type FleetOptions } from "./container-spec.js";
import type { KeptWorkspace, WorkspaceSaves } from "./workspaces/workspace-saves.js";
import { startFromTemplate, type WorkspaceStart } from "./workspaces/templates.js";
import { reapReason } from "./reap-rules.js";
import { WarmPools } from "./warm-pools.js";

/** One running sandbox and the connection to its agent; its workspace is kept by workspaces/workspace-saves.ts. */
export interface Sandbox extends KeptWorkspace {
  readonly id: string;
  readonly container: Container;
  readonly createdAt: number;
  /** The image it runs (the service's, or one a template names). */
  readonly image: string;
  name: string;
  key: string;
  lastUsed: number;
}

export interface SandboxSummary {
  containerId: string;
  name: string;
  scopeKey: string;
  state: string;
  createdAt: number;
  lastUsed?: number;
  pooled: boolean;
  runningCommands: number;
  image: string;
}

export class SandboxFleet {
  private readonly byKey = new Map<string, Promise<Sandbox>>();
  /** The warm pools, one per image: started, greeted, unclaimed. */
  private readonly pools = new WarmPools<Sandbox>();
  /** The config labels of containers this fleet may keep: one per image it may run (configHash). */
  private readonly configs: Set<string>;
  /** Names of containers being made, which the reaper must leave alone. */
  private readonly making = new Set<string>();
  /** The background fill under way, if any (shutdown waits for it, so nothing it makes leaks). */
  private filling: Promise<void> | undefined;
  private closed = false;
  private readonly events: ContainerEvents;
  /** Containers being removed by us, by the id or name they were removed under. */
  private readonly removing = new Set<string>();
  /** When the reaper first saw a claimed container this process has not used (its key may come back). */
  private readonly firstSeen = new Map<string, number>();

  constructor(
    private readonly docker: Engine,
    private readonly opts: FleetOptions,
    private readonly logger: Logger,
    /** A command's connection to its sandbox's egress port (egress-proxy.ts); closed when absent. */
    private readonly onConnection?: (socket: AgentSocket, agent: AgentConnection) => void,
    /** Where workspaces are kept past their containers; absent: a workspace goes with its container. */
    private readonly saves?: WorkspaceSaves,
    /** The images it may run (the default's included), and those whose pools it keeps full now. */
    private readonly images: { allowed: readonly string[]; pooled: () => Iterable<string> } = {
      allowed: [opts.image],
      pooled: () => [opts.image],
    },
  ) {
    this.configs = new Set([opts.image, ...images.allowed].map((image) => configHash({ ...opts, image })));
    this.events = new ContainerEvents(docker, opts.instance, (death) => void this.died(death));
  }

  /** Watches the engine's events (see ContainerEvents.watch); call from time to time. */
  watch(): Promise<void> {
    return this.events.watch();
  }

  /** OOM kills the engine reported for this container. */
  ooms(containerId: string): number {
    return this.events.ooms(containerId);
  }

  /**
   * The key's sandbox: the one it has, else a pooled or new one of its start's image holding its
   * save, or else its start's files (`startOf` is asked only when a sandbox is made).
   */
  async get(key: string, startOf = (): WorkspaceStart => ({ agentId: "", image: this.opts.image })): Promise<Sandbox> {
    let p = this.byKey.get(key);
    if (p) {
      const sandbox = await p.catch(() => undefined);
      if (sandbox?.agent.alive) return sandbox;
      if (this.byKey.get(key) === p) this.byKey.delete(key);
    }
    p = this.byKey.get(key);
    if (!p) {
      p = this.acquire(key, startOf());
      this.byKey.set(key, p);
      p.catch(() => {
        if (this.byKey.get(key) === p) this.byKey.delete(key);
      });
    }
    return p;
  }

  /** The keys this process holds a sandbox for (or is making one for), read-only. */
  get held(): ReadonlyMap<string, unknown> {
    return this.byKey;
  }

  /** The key's sandbox if it has one (adopting one a previous service process left), without making one. */
  async find(key: string): Promise<Sandbox | undefined> {
    const known = await this.byKey.get(key)?.catch(() => undefined);
    if (known?.agent.alive) return known;
    const adopted = await this.adopt(key, containerName(this.opts.instance, key));
    if (adopted) this.byKey.set(key, Promise.resolve(adopted));
    return adopted;
  }

  /** Removes the key's sandbox and its workspace, saved or not; false if it had neither. */
  async release(key: string): Promise<boolean> {
    const known = await this.byKey.get(key)?.catch(() => undefined);
    this.byKey.delete(key);
    if (known) {
      clearTimeout(known.saveTimer);
      known.unsaved = false;
      await known.saving;
    }
    known?.agent.close();
    const removed = await this.remove(this.docker.getContainer(containerName(this.opts.instance, key)));
    const saved = (await this.saves?.remove(key)) ?? false;
    return removed || saved;
  }

  /** Work was done in the sandbox for `tenant`: its workspace is saved soon (a no-op without saves). */
  used(sandbox: Sandbox, tenant: string): void {
    this.saves?.used(sandbox, tenant);
  }

  /**
   * Unpacks the key's saved workspace into its new sandbox (workspace-saves.ts), or when it has
   * none its template's files, and notes for its next command what it starts from.
   */
  private async restored(sandbox: Sandbox, start: WorkspaceStart): Promise<Sandbox> {
    if (!(await this.saves?.restoreInto(sandbox))) await startFromTemplate(sandbox, start, this.logger);
    return sandbox;
  }

  /** Removes a sandbox that stopped answering; its key gets a new one on next use. */
  async discard(sandbox: Sandbox, why: string): Promise<void> {
    this.logger.warn(`discarding the sandbox of ${sandbox.key}: ${why}`);
    await this.forget(sandbox.id);
    await this.letGo(sandbox);
  }

  private async acquire(key: string, start: WorkspaceStart): Promise<Sandbox> {
    const name = containerName(this.opts.instance, key);
    const existing = await this.adopt(key, name);
    if (existing) return existing;
    const claimed = await this.claimFromPool(key, name, start.image);
    return this.restored(claimed ?? (await this.make(name, start.image, key)), start);
  }

  /**
   * Takes over the key's container if one is running (left by an earlier service process):
   * attaches and greets its agent. A container that is stopped, or whose agent does not answer
   * (an image from before the agent), is removed.
   */
  private async adopt(key: string, name: string): Promise<Sandbox | undefined> {
    const container = this.docker.getContainer(name);
    const info = await container.inspect().catch(() => undefined);
    if (!info) return undefined;
    const labels = info.Config.Labels ?? {};
    if (!info.State.Running || !this.configs.has(labels["troupe.config"] ?? "")) {
      await this.remove(container);
      return undefined;
    }
    const agent = await AgentConnection.attach(container, this.attachOptions(container, name));
    try {
      await agent.hello();
    } catch (err) {
      this.logger.warn(`the sandbox ${name} does not answer; replacing it`, { error: (err as Error).message });
      agent.close();
      await this.remove(container);
      return undefined;
    }
    const createdAt = Number(labels["troupe.created"] ?? Date.parse(info.Created));
    const image = labels["troupe.image"] ?? this.opts.image;
    return {
      id: info.Id,
      container,
      agent,
      createdAt,
      image,
      name,
      key: agent.claimedFor || key,
      lastUsed: Date.now(),
    };
  }

  private async claimFromPool(key: string, name: string, image: string): Promise<Sandbox | undefined> {
    try {
      return await this.claimOne(key, name, image);
    } finally {
      // Refilled after the claim, not during it: a container being made competes with the
      // rename for the engine.
      this.fill();
    }
  }

  private async claimOne(key: string, name: string, image: string): Promise<Sandbox | undefined> {
    for (let sandbox = this.pools.take(image); sandbox; sandbox = this.pools.take(image)) {
      if (!sandbox.agent.alive) continue;
      try {
        await sandbox.container.rename(name);
        await sandbox.agent.claim(key);
      } catch (err) {
        this.logger.warn("could not claim a pooled sandbox; trying another", { error: (err as Error).message });
        await this.letGo(sandbox);
        continue;
      }
      sandbox.name = name;
      sandbox.key = key;
      sandbox.lastUsed = Date.now();
      return sandbox;
    }
    return undefined;
  }

  /** Creates, attaches to, starts and greets a sandbox of `image`; for a key, or for the pool (no key). */
  private async make(name: string, image: string, key?: string): Promise<Sandbox> {
    this.making.add(name);
    const opts = { ...this.opts, image };
    try {
      let container: Container;
      try {
        container = await this.docker.createContainer(containerSpec(opts, name, key));
      } catch (err) {
        const status = (err as { statusCode?: number }).statusCode;
        if (status === 404)
          throw failedPrecondition(
            image === this.opts.image
              ? `sandbox image ${image} is missing: build it with \`make sandbox-image\``
              : `sandbox image ${image} (a template's) is missing from the engine: pull or build it`,
          );
        if (status === 409 && key !== undefined) {
          // The name is taken: a container made for this key a moment ago by someone else, or
          // one left stopped. Take it if it runs, else clear the name and make it once more.
          const adopted = await this.adopt(key, name);
          if (adopted) return adopted;
          container = await this.docker.createContainer(containerSpec(opts, name, key));
        } else throw err;
      }
      try {
        const agent = await AgentConnection.attach(container, this.attachOptions(container, name));
        await container.start();
        await agent.hello();
        if (key !== undefined) await agent.claim(key);
        const now = Date.now();
        return { id: container.id, container, agent, createdAt: now, image, name, key: key ?? "", lastUsed: now };
      } catch (err) {
        await this.remove(container);
        throw err;
      }
    } finally {
      this.making.delete(name);
    }
  }

  /** The images whose pools are kept now (the service's, and those its templates name). */
  private readonly wanted = (): Set<string> => new Set(this.images.pooled());

  /** The images whose pools are short of the pool size. */
  private short(): string[] {
    return [...this.wanted()].filter((image) => this.pools.sizeOf(image) < this.opts.poolSize);
  }

  /** Lets go of the pools of images nothing names now; tops the others up in the background. */
  fill(): void {
    if (this.closed) return;
    for (const unwanted of this.pools.dropExcept(this.wanted())) void this.letGo(unwanted);
    if (this.filling || this.short().length === 0) return;
    const run = async () => {
      for (let image = this.short()[0]; image !== undefined && !this.closed; image = this.short()[0]) {
        try {
          const sandbox = await this.make(`${poolPrefix(this.opts.instance)}${randomBytes(6).toString("hex")}`, image);
          // Made for nothing: the service is closing, or the image's template went meanwhile.
          if (this.closed || !this.wanted().has(image)) await this.letGo(sandbox);
          else this.pools.add(image, sandbox);
        } catch (err) {
          this.logger.warn("could not fill the sandbox pool", { image, error: (err as Error).message });
          return;
        }
      }
    };
    // Cleared in a callback, which always runs after this assignment.
    this.filling = run().finally(() => (this.filling = undefined));
  }

  get pooled(): number {
    return this.pools.size;
  }

  /** Sandboxes claimed by a scope key (made or being made) in this process. */
  get claimed(): number {
    return this.byKey.size;
  }

  /**
   * Removes this instance's containers that are stopped, made under other settings, older than
   * the maximum age, or unused for the idle time with no command running; and pooled ones this
   * process did not make (left by an earlier one). Other deployments' containers are never
   * touched. A claimed container this process has not used yet counts as used when first seen:
   * its key may come back.
   */
  async reap(): Promise<number> {
    // Work not yet saved in sandboxes the reaper may remove is saved first: a save takes a while,
    // and the removals below must go by a fresh listing (one taken before a save saw containers
    // then being made as not running).
    if (this.saves)
      for (const s of (await this.live()).values())
        if (
          s.unsaved &&
          s.key !== "" &&
          (Date.now() - s.lastUsed > this.opts.idleMs || Date.now() - s.createdAt > this.opts.maxAgeMs)
        )
          await this.saves.saveNow(s);
    const now = Date.now();
    let removed = 0;
    for (const { c, name, mine, pooled, created } of await this.containers()) {
      if (this.making.has(name)) continue;
      if (c.State === "running" && !mine && !pooled) this.firstSeen.set(c.Id, this.firstSeen.get(c.Id) ?? now);
      const lastUsed = mine?.lastUsed ?? this.firstSeen.get(c.Id) ?? now;
      const why = reapReason({
        running: c.State === "running",
        leftInPool: pooled && !mine,
        age: now - created,
        idle: pooled ? 0 : now - lastUsed,
        busy: (mine?.agent.runningCommands ?? 0) > 0,
        knownSettings: this.configs.has(c.Labels["troupe.config"] ?? ""),
        limits: this.opts,
      });
      if (!why) continue;
      // Work not saved yet (done after the saves above): the next pass decides again.
      if (mine?.unsaved && c.State === "running" && why !== "stopped") continue;
      if (mine) clearTimeout(mine.saveTimer);
      await this.forget(c.Id);
      this.firstSeen.delete(c.Id);
      this.events.forget(c.Id);
      if (await this.remove(this.docker.getContainer(c.Id))) {
        removed++;
        this.logger.info(`removed sandbox ${name}: ${why}`, { scope: mine?.key ?? c.Labels["troupe.scope"] ?? "" });
      }
    }
    this.fill();
    return removed;
  }

  /** This instance's containers as the engine lists them, with what this process knows of each. */
  async list(): Promise<SandboxSummary[]> {
    return (await this.containers()).map(({ c, name, mine, pooled, created }) => ({
      containerId: c.Id,
      name,
      scopeKey: mine?.key ?? c.Labels["troupe.scope"] ?? "",
      // Running, but not yet greeted (or not yet pooled): not ready for a claim.
      state: this.making.has(name) ? "starting" : c.State,
      createdAt: created,
      lastUsed: mine?.lastUsed,
      pooled,
      runningCommands: mine?.agent.runningCommands ?? 0,
      image: c.Labels["troupe.image"] ?? this.opts.image,
    }));
  }

  private async containers() {
    const list = await this.docker.listContainers({
      all: true,
      filters: { label: [`troupe.instance=${this.opts.instance}`, "troupe.owner=troupe-sandbox"] },
    });
    const live = await this.live();
    return list.map((c) => {
      const name = (c.Names[0] ?? "").replace(/^\//, "");
      return {
        c,
        name,
        mine: live.get(c.Id),
        pooled: name.startsWith(poolPrefix(this.opts.instance)),
        created: Number(c.Labels["troupe.created"] ?? c.Created * 1000),
      };
    });
  }

  /**
   * Ends the engine watch and removes the pool (tenant-neutral, cheap to make again). Claimed
   * sandboxes stay, their unsaved work saved.
   */
  async shutdown(): Promise<void> {
    for (const s of (await this.live()).values()) if (s.unsaved) await this.saves?.saveNow(s);
    this.closed = true;
    this.events.close();
    await this.filling;
    const pool = this.pools.clear();
    await Promise.all(pool.map((s) => this.letGo(s)));
    for (const p of this.byKey.values())
      void p.then(
        (s) => s.agent.close(),
        () => undefined,
      );
  }

  private async live(): Promise<Map<string, Sandbox>> {
    const live = new Map<string, Sandbox>();
    for (const s of this.pools.all()) live.set(s.id, s);
    for (const p of this.byKey.values()) {
      const s = await p.catch(() => undefined);
      if (s) live.set(s.id, s);
    }
    return live;
  }

  /** Drops every record of a container (it died, or is being removed). */
  private async forget(containerId: string): Promise<void> {
    this.pools.remove(containerId)?.agent.close();
    for (const [key, p] of this.byKey) {
      const s = await p.catch(() => undefined);
      if (s?.id === containerId && this.byKey.get(key) === p) this.byKey.delete(key);
    }
  }

  /**
   * A container ended. One nobody removed died under its commands (or in the pool): that is worth
   * a warning with the engine's exit code, since nothing else tells an operator why its commands
   * were killed. Decided at once, before the reaper (which may already be removing it as stopped)
   * or anything else forgets it.
   */
  private async died({ id, name, exitCode, scope }: ContainerDeath): Promise<void> {
    const asked = this.removing.has(id) || this.removing.has(name);
    const oomKilled = this.events.ooms(id) > 0;
    const held = asked ? undefined : (await this.live()).get(id);
    if (!asked)
      this.logger.warn(`sandbox ${name} ended on its own`, {
        container: id.slice(0, 12),
        exitCode,
        oomKilled,
        scope: held?.key || scope || "(pool)",
      });
    await this.forget(id);
  }

  /** Closes a sandbox's agent connection and removes its container. */
  private letGo(sandbox: Sandbox): Promise<boolean> {
    sandbox.agent.close();
    return this.remove(sandbox.container);
  }

  private async remove(container: Container): Promise<boolean> {
    // Marked for as long as its die event may take to arrive.
    this.removing.add(container.id);
    setTimeout(() => this.removing.delete(container.id), 30_000).unref();
    return container.remove().then(
      () => true,
      (err: { statusCode?: number; message?: string }) => {
        // 404: gone already; 409: someone (the die-event handler, a release) is removing it.
        if (err.statusCode !== 404 && err.statusCode !== 409)
          this.logger.warn("could not remove a sandbox", { container: container.id.slice(0, 12), error: err.message });
        return false;
      },
    );
  }

  /**
   * A sandbox's connection reports here: its agent's stderr (escaped and rate-limited by the
   * connection), and a broken protocol, which ends that sandbox alone: forgotten and removed, so
   * its key's next request makes a new one.
   */
  private attachOptions(container: Container, name: string): AttachOptions {
    return {
      diagnostics: (line) => this.logger.warn(`sandbox agent (${name}): ${line}`),
      connection: (socket, agent) => (this.onConnection ? this.onConnection(socket, agent) : socket.destroy()),
      lost: (reason, runningCommands) => {
        if (!this.closed)
          this.logger.warn(`lost the agent connection of sandbox ${name}: ${reason}`, { runningCommands });
      },
      broken: (reason) => {
        this.logger.error(`sandbox ${name} broke the agent protocol (${reason}); removing it`);
        void this.forget(container.id)
          .then(() => this.remove(container))
          .catch(() => undefined);
      },
    };
  }
}
