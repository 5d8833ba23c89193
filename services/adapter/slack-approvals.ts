// Tool calls put to a person in Slack (docs/approvals.md): a message whose Block Kit `actions`
// block holds an Approve and a Reject button (https://api.slack.com/reference/block-kit/blocks
// #actions), each carrying a token the adapter's state maps to the call. A click comes back as a
// `block_actions` interaction (https://api.slack.com/reference/interaction-payloads/block-actions):
// POSTed form-encoded as `payload=<json>` to the Interactivity Request URL (the same /slack/events,
// signed the same way), or as an `interactive` Socket Mode envelope. It becomes DecideToolCall
// naming the person who clicked (`slack:<user id>`), and the message is updated to say the
// outcome without its buttons. In a DM its person decides; in a channel, the operator's command
// users.
import { randomBytes } from "node:crypto";
import { Status, grpcCode } from "../shared/errors.js";
import { ToolVerdict } from "../shared/gen/troupe/v1/session_pb.js";
import type { Logger } from "../shared/process/log.js";
import type { GatewayClient } from "./deliver.js";
import type { HeldCall } from "./replies.js";
import { SlackApiError, type SlackApi } from "./slack-api.js";
import type { AdapterState, Address, Post } from "./state.js";

const APPROVE = "troupe_approve";
const REJECT = "troupe_reject";
const TOKEN = /^[A-Za-z0-9_-]{16}$/;
/** A section's text is at most 3,000 characters. */
const SHOWN = 2500;

/** What of a block_actions payload is read. */
export interface BlockActions {
  type: "block_actions";
  user: { id: string };
  channel?: { id: string };
  message?: { ts: string; text?: string };
  actions: { action_id: string; value?: string }[];
}

export function slackApprovals(opts: {
  api: SlackApi;
  gateway: GatewayClient;
  state: AdapterState;
  channel: string;
  commandUsers: Set<string>;
  logger: Logger;
}) {
  const { api, gateway, state } = opts;
  const update = (channel: string, ts: string, text: string) =>
    api
      .call("chat.update", { channel, ts, text, blocks: [section(text)] })
      .catch((err: unknown) => opts.logger.warn("could not update a decided question", { error: String(err) }));

  return {
    async ask(to: Address, post: Post, held: HeldCall): Promise<void> {
      const token = randomBytes(12).toString("base64url");
      state.asks.set(token, { sessionId: held.sessionId, toolCallId: held.toolCallId, toolName: held.toolName });
      const args =
        held.argumentsJson.length > SHOWN ? `${held.argumentsJson.slice(0, SHOWN)} [...]` : held.argumentsJson;
      const text = escaped(`The agent wants to run ${held.toolName}:\n${args}\n(${held.rule})`);
      for (let attempt = 0; ; attempt++) {
        try {
          const res = await api.call<{ ts: string }>("chat.postMessage", {
            channel: to.chat_id,
            text,
            ...(to.thread_id ? { thread_ts: to.thread_id } : {}),
            blocks: [
              section(text),
              {
                type: "actions",
                elements: [button("Approve", APPROVE, token, "primary"), button("Reject", REJECT, token, "danger")],
              },
            ],
          });
          post.ids = [res.ts];
          return;
        } catch (err) {
          if (!(err instanceof SlackApiError && err.status === 429) || attempt >= 4) throw err;
          await new Promise((r) => setTimeout(r, (err.retryAfterS ?? 1) * 1000));
        }
      }
    },

    /** A click on one of the buttons. Resolves once decided (or refused); rejects only when the gateway could not be reached. */
    async clicked(p: BlockActions): Promise<void> {
      const action = p.actions.find((a) => a.action_id === APPROVE || a.action_id === REJECT);
      const token = action?.value ?? "";
      const ask = TOKEN.test(token) ? state.asks.get(token) : undefined;
      const where = p.channel?.id ?? "";
      if (!action || !ask) return;
      // A DM's channel id starts with D: its person may decide there; elsewhere the operators.
      const mayDecide = where.startsWith("D") || opts.commandUsers.has(p.user.id);
      if (!mayDecide) {
        await api
          .call("chat.postEphemeral", {
            channel: where,
            user: p.user.id,
            text: "Only the person this conversation is with, or an operator, decides.",
          })
          .catch(() => undefined);
        return;
      }
      const approve = action.action_id === APPROVE;
      try {
        await gateway.decideToolCall({
          sessionId: ask.sessionId,
          frameId: `slack-click-${token}-${p.user.id}`,
          toolCallId: ask.toolCallId,
          verdict: approve ? ToolVerdict.APPROVE : ToolVerdict.REJECT,
          channelSender: `${opts.channel}:${p.user.id}`,
        });
      } catch (err) {
        const code = grpcCode(err);
        if (code !== Status.NOT_FOUND && code !== Status.FAILED_PRECONDITION) throw err;
      }
      state.asks.delete(token);
      await state.save();
      if (p.message)
        await update(
          where,
          p.message.ts,
          `${p.message.text ?? ""}\n${approve ? "Approved" : "Rejected"} by <@${p.user.id}>.`,
        );
    },
  };
}

/** Text for mrkdwn: &, < and > escaped, as Slack asks (https://api.slack.com/reference/surfaces/formatting#escaping). */
const escaped = (s: string) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");

const section = (text: string) => ({ type: "section", text: { type: "mrkdwn", text } });
const button = (label: string, actionId: string, value: string, style: "primary" | "danger") => ({
  type: "button",
  text: { type: "plain_text", text: label },
  action_id: actionId,
  value,
  style,
});
