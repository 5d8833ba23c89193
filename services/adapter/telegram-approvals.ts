// Tool calls put to a person in Telegram (docs/approvals.md): a message with an inline keyboard
// (https://core.telegram.org/bots/api#inlinekeyboardmarkup), Approve and Reject, whose presses
// come back as callback queries. A press is answered with answerCallbackQuery (Telegram shows the
// button as loading until then), becomes DecideToolCall naming the person who pressed
// (`telegram:<user id>`), and the question is edited to say the outcome, without its buttons.
// In a private chat its person decides; in a group, only the operators' command users.
import { randomBytes } from "node:crypto";
import { Status, grpcCode } from "../shared/errors.js";
import { ToolVerdict } from "../shared/gen/troupe/v1/session_pb.js";
import type { Logger } from "../shared/process/log.js";
import { BotApiError, type BotApi, type TgCallbackQuery, type TgMessage, type TgUser } from "./bot-api.js";
import type { GatewayClient } from "./deliver.js";
import type { HeldCall } from "./replies.js";
import type { AdapterState, Address, Post } from "./state.js";

/** callback_data is 1-64 bytes: the verdict's letter and a token the state maps to the call. */
const DATA = /^([ar]):([A-Za-z0-9_-]{16})$/;
const ARGUMENTS_SHOWN = 1500;

export interface TelegramApprovals {
  ask(to: Address, post: Post, held: HeldCall): Promise<void>;
  pressed(q: TgCallbackQuery): Promise<void>;
}

export function telegramApprovals(opts: {
  api: BotApi;
  gateway: GatewayClient;
  state: AdapterState;
  channel: string;
  commandUsers: Set<string>;
  logger: Logger;
}): TelegramApprovals {
  const { api, gateway, state } = opts;
  const answer = (q: TgCallbackQuery, text: string, alert = false) =>
    api.call("answerCallbackQuery", { callback_query_id: q.id, text, show_alert: alert });

  return {
    async ask(to, post, held) {
      const token = randomBytes(12).toString("base64url");
      state.asks.set(token, { sessionId: held.sessionId, toolCallId: held.toolCallId, toolName: held.toolName });
      const args =
        held.argumentsJson.length > ARGUMENTS_SHOWN
          ? `${held.argumentsJson.slice(0, ARGUMENTS_SHOWN)} [...]`
          : held.argumentsJson;
      const text = `The agent wants to run ${held.toolName}:\n${args}\n\n(${held.rule})`;
      for (let attempt = 0; ; attempt++) {
        try {
          const msg = await api.call<TgMessage>("sendMessage", {
            chat_id: to.chat_id,
            text,
            ...(to.thread_id ? { message_thread_id: Number(to.thread_id) } : {}),
            reply_markup: {
              inline_keyboard: [
                [
                  { text: "Approve", callback_data: `a:${token}` },
                  { text: "Reject", callback_data: `r:${token}` },
                ],
              ],
            },
          });
          post.ids = [String(msg.message_id)];
          return;
        } catch (err) {
          // Flood control: wait as told, a few times; the question matters more than a reply.
          if (!(err instanceof BotApiError && err.code === 429) || attempt >= 4) throw err;
          await new Promise((r) => setTimeout(r, (err.retryAfterS ?? 1) * 1000));
        }
      }
    },

    async pressed(q) {
      const m = DATA.exec(q.data ?? "");
      const ask = m ? state.asks.get(m[2]!) : undefined;
      if (!m || !ask) return void (await answer(q, "This question is no longer open.", true));
      const chat = q.message?.chat;
      const mayDecide = (chat?.type === "private" && chat.id === q.from.id) || opts.commandUsers.has(String(q.from.id));
      if (!mayDecide)
        return void (await answer(q, "Only the person this chat is with, or an operator, decides.", true));
      const approve = m[1] === "a";
      try {
        await gateway.decideToolCall({
          sessionId: ask.sessionId,
          // A press Telegram sends again is the same decision, taken once.
          frameId: `tg-press-${q.id}`,
          toolCallId: ask.toolCallId,
          verdict: approve ? ToolVerdict.APPROVE : ToolVerdict.REJECT,
          channelSender: `${opts.channel}:${q.from.id}`,
        });
      } catch (err) {
        const code = grpcCode(err);
        if (code !== Status.NOT_FOUND && code !== Status.FAILED_PRECONDITION) throw err;
        state.asks.delete(m[2]!);
        await answer(q, "Already decided, or the run no longer waits.", true);
        return;
      }
      state.asks.delete(m[2]!);
      await state.save();
      const outcome = `${approve ? "Approved" : "Rejected"} by ${nameOf(q.from)}.`;
      await answer(q, outcome);
      // The question says how it was decided, and its buttons go (an edit without reply_markup).
      if (q.message?.text)
        await api
          .call("editMessageText", {
            chat_id: q.message.chat.id,
            message_id: q.message.message_id,
            text: `${q.message.text}\n\n${outcome}`,
          })
          .catch((err: unknown) => opts.logger.warn("could not mark a decided question", { error: String(err) }));
    },
  };
}

const nameOf = (u: TgUser) => [u.first_name, u.last_name].filter(Boolean).join(" ") || u.username || String(u.id);
