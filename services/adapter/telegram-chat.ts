// Telegram as a ChatApi (drafted-replies.ts), from https://core.telegram.org/bots/api: sendMessage
// takes 1-4096 characters, editMessageText refuses an unchanged text ("message is not modified",
// which is success here), flood control answers 429 with parameters.retry_after. Telegram asks
// bots to keep near one message a second per chat
// (https://core.telegram.org/bots/faq#my-bot-is-hitting-limits-how-do-i-avoid-this).
import { BotApiError, type BotApi, type TgMessage } from "./bot-api.js";
import type { ChatApi } from "./drafted-replies.js";
import type { Address } from "./state.js";

const NOT_MODIFIED = /message is not modified/i;

export function telegramChat(api: BotApi): ChatApi {
  return {
    maxChars: 4096,
    async send(to: Address, text: string, first: boolean) {
      const msg = await api.call<TgMessage>("sendMessage", {
        chat_id: to.chat_id,
        text,
        ...(to.thread_id ? { message_thread_id: Number(to.thread_id) } : {}),
        // The first part answers the message it replies to (if that is gone, it is sent anyway).
        ...(first && to.message_id
          ? { reply_parameters: { message_id: Number(to.message_id), allow_sending_without_reply: true } }
          : {}),
      });
      return String(msg.message_id);
    },
    async edit(to: Address, id: string, text: string) {
      try {
        await api.call("editMessageText", { chat_id: to.chat_id, message_id: Number(id), text });
      } catch (err) {
        if (!(err instanceof BotApiError && NOT_MODIFIED.test(err.description))) throw err;
      }
    },
    retryAfterS: (err) => (err instanceof BotApiError && err.code === 429 ? (err.retryAfterS ?? 1) : undefined),
    transient: (err) => !(err instanceof BotApiError) || err.code >= 500,
  };
}
