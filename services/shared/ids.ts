import { randomUUID } from "node:crypto";

export const newId = (): string => randomUUID();

/** The agent a session belongs to when the client names none. */
export const DEFAULT_AGENT = "main";

// Session ids become file names under the data directory and container labels, so they are
// restricted to a safe alphabet; client frame ids only need to be printable and bounded.
const SESSION_ID = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;
const FRAME_ID = /^[\x21-\x7e]{1,128}$/;
const AGENT_ID = /^[a-z0-9][a-z0-9_-]{0,63}$/;

/** A channel's name (telegram, discord, web...): it becomes part of session keys and identity links. */
export const CHANNEL_NAME = /^[a-z0-9_-]{1,32}$/;

export const isSessionId = (s: string): boolean => SESSION_ID.test(s) && !s.includes("..");
export const isFrameId = (s: string): boolean => FRAME_ID.test(s);
export const isAgentId = (s: string): boolean => AGENT_ID.test(s);

/**
 * Sessions made from a client's own conversation for one request (the OpenAI endpoint's Chat
 * Completions without a session): kept for a retry or a client tool's result, deleted by the
 * runner's retention sweep after an idle hour.
 */
export const CONVERSATION_SESSION_PREFIX = "openai-conversation-";
export const CONVERSATION_SESSION_IDLE_MS = 60 * 60_000;
/**
 * Sessions made for a stored Responses API conversation (POST /v1/responses without
 * previous_response_id): they hold its responses, and are kept as the agent keeps any session.
 */
export const RESPONSE_SESSION_PREFIX = "openai-response-";
