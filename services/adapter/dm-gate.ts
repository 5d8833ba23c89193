// Who may write to the agent in private through this adapter: its DM policy, checked before a
// direct message is delivered, so that nothing of a sender it refuses reaches a session or a model.
//   open       anyone (the webhook adapter's default: its caller vouches for its users);
//   allowlist  only the senders in TROUPE_ADAPTER_ALLOW_FROM (and the command users);
//   pairing    those, and whoever the operator let in: a stranger's first message is answered with
//              a one-time code, and `troupe pairing approve CODE` lets them in (pairing-book.ts).
//              The default of the public adapters, Telegram and Slack.
// Group and channel messages are not direct messages: the adapters' own rules (a mention, a reply)
// decide those.
import type { Logger } from "../shared/process/log.js";
import { CODE_TTL_MS, PairingBook } from "./pairing-book.js";
import type { Address } from "./state.js";

export type DmPolicy = "open" | "allowlist" | "pairing";

/** What the operator set for an adapter (cli/adapter.ts). */
export interface DmSettings {
  policy: DmPolicy;
  /** Sender ids let in whatever the policy (the operator's own, say). */
  allowFrom: ReadonlySet<string>;
  /** The adapter's state file: the pairing book lives beside it. */
  stateFile: string;
}

export interface DmGateOptions extends DmSettings {
  /** Sends `text` to a private chat. May reject. */
  tell(to: Address, text: string): Promise<void>;
  logger: Logger;
}

/** How often the operator's requests (troupe pairing) are looked for. */
const REQUESTS_EVERY_MS = 1000;

export class DmGate {
  private timer?: NodeJS.Timeout;
  private taking = false;

  private constructor(
    private readonly opts: DmGateOptions,
    private readonly book?: PairingBook,
  ) {}

  static async start(opts: DmGateOptions): Promise<DmGate> {
    const gate = new DmGate(opts, opts.policy === "pairing" ? await PairingBook.open(opts.stateFile) : undefined);
    if (gate.book) {
      gate.timer = setInterval(() => void gate.takeRequests(), REQUESTS_EVERY_MS);
      gate.timer.unref();
      await gate.takeRequests();
    }
    return gate;
  }

  /**
   * Whether a private message from `sender` may go on to the agent. A stranger under pairing is
   * told their code once (again only after it expired); other refusals are silent.
   */
  async admit(sender: { id: string; name: string }, chat: Address): Promise<boolean> {
    const { policy, allowFrom } = this.opts;
    if (policy === "open" || allowFrom.has(sender.id) || this.book?.isAllowed(sender.id)) return true;
    if (!this.book) {
      this.opts.logger.info("a direct message from a sender not on the allowlist was dropped", { sender: sender.id });
      return false;
    }
    const given = await this.book.codeFor(sender.id, sender.name, chat);
    if (!given) {
      this.opts.logger.warn("a stranger's direct message was dropped: too many pairing requests wait", {
        sender: sender.id,
      });
      return false;
    }
    if (given.fresh) {
      this.opts.logger.info(`pairing requested by ${sender.id} (${sender.name}): troupe pairing approve ${given.code}`);
      await this.opts
        .tell(
          chat,
          `This agent talks only with people its operator has let in. Your pairing code is ${given.code}: ` +
            `give it to the operator, who lets you in with \`troupe pairing approve ${given.code}\`. ` +
            `It is good for ${CODE_TTL_MS / 60_000} minutes; until then nothing you write here is read.`,
        )
        .catch((err: Error) => this.opts.logger.warn("could not send a pairing code", { error: err.message }));
    }
    return false;
  }

  private async takeRequests(): Promise<void> {
    if (this.taking || !this.book) return;
    this.taking = true;
    try {
      for (const p of await this.book.takeRequests()) {
        this.opts.logger.info(`pairing approved: ${p.senderId} (${p.name}) may write to the agent`);
        await this.opts
          .tell(p.chat, "You are let in: write again and the agent will answer.")
          .catch((err: Error) =>
            this.opts.logger.warn("could not tell a sender they were let in", { error: err.message }),
          );
      }
    } catch (err) {
      this.opts.logger.warn("pairing requests could not be read", { error: String(err) });
    } finally {
      this.taking = false;
    }
  }

  close(): void {
    clearInterval(this.timer);
  }
}
