// What the provider SDKs (openai-sdk.ts, anthropic-sdk.ts) are given and what they give back, the
// same for both: the fetch they call reads a refusal's body once, bounded (16 KiB), words it with
// errorOf (which knows every shape servers answer with) and hands the SDK that wording in the
// shape both SDKs parse; the SDK's error is turned back into the ProviderRefusal the loop knows.
// So a refusal is worded the same whichever SDK made the call, and a server answering a gigabyte
// of HTML costs 16 KiB.
import { type Fetch, ProviderRefusal, refusal } from "./provider-post.js";

/** `fetch`, with each answer outside 2xx read (bounded) and put in the error shape both SDKs parse. */
export function refusalsKept(fetch: Fetch): Fetch {
  return async (url, init) => {
    const response = await fetch(url, init);
    if (response.ok) return response;
    const r = await refusal(response);
    const headers = new Headers(response.headers);
    for (const name of ["content-length", "content-encoding", "transfer-encoding"]) headers.delete(name);
    headers.set("content-type", "application/json");
    const error = {
      type: "error",
      error: { type: r.code ?? "error", message: r.message, code: r.code, param: r.param },
    };
    return new Response(JSON.stringify(error), { status: response.status, statusText: response.statusText, headers });
  };
}

/** The error an SDK read from refusalsKept's answer: OpenAI's keeps the inner object, Anthropic's the whole body. */
type SdkErrorBody = { message?: unknown; code?: unknown; param?: unknown; error?: SdkErrorBody };
const text = (v: unknown) => (typeof v === "string" ? v : undefined);

/**
 * The answer of an SDK call. Contract: ProviderPost's: the answer when 2xx, its body unread; a
 * ProviderRefusal for any other status; what the fetch threw when there was no answer (the SDKs
 * wrap it as their connection error's cause) or the SDK's abort error.
 */
export async function sdkAnswer(call: () => Promise<Response>): Promise<Response> {
  try {
    return await call();
  } catch (err) {
    const e = err as { status?: unknown; headers?: unknown; error?: SdkErrorBody; cause?: unknown };
    if (typeof e?.status === "number" && e.headers instanceof Headers) {
      const body = e.error?.error ?? e.error;
      throw new ProviderRefusal(
        e.status,
        text(body?.message) ?? String((err as Error).message),
        e.headers,
        text(body?.code),
        text(body?.param),
      );
    }
    throw e?.cause ?? err;
  }
}
