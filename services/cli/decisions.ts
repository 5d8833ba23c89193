// Decisions on held tool calls as a person types them: at `troupe chat`'s prompt ("y", "n why",
// "e {json}") and as `troupe sessions decide`'s words ("approve", "reject", "edit").
import { ToolVerdict } from "../shared/gen/troupe/v1/session_pb.js";

export interface TypedDecision {
  verdict: ToolVerdict;
  message: string;
  argumentsJson: string;
}

const WORDS: Record<string, ToolVerdict> = {
  y: ToolVerdict.APPROVE,
  yes: ToolVerdict.APPROVE,
  approve: ToolVerdict.APPROVE,
  n: ToolVerdict.REJECT,
  no: ToolVerdict.REJECT,
  reject: ToolVerdict.REJECT,
  e: ToolVerdict.EDIT,
  edit: ToolVerdict.EDIT,
};

/**
 * The decision a line says, or undefined when it says none (then it is a message, not an answer).
 * After the word: a reject's reason, or an edit's arguments as a JSON object.
 */
export function parseDecision(line: string): TypedDecision | { error: string } | undefined {
  const m = /^\s*(\S+)\s*([\s\S]*)$/.exec(line);
  const verdict = m ? WORDS[m[1].toLowerCase()] : undefined;
  if (verdict === undefined) return undefined;
  const rest = m![2].trim();
  if (verdict === ToolVerdict.APPROVE) return { verdict, message: "", argumentsJson: "" };
  if (verdict === ToolVerdict.REJECT) return { verdict, message: rest, argumentsJson: "" };
  try {
    const args: unknown = JSON.parse(rest);
    if (typeof args !== "object" || args === null || Array.isArray(args)) throw new Error("not an object");
  } catch {
    return { error: 'an edit is "e" and the arguments as a JSON object, e.g. e {"command": "ls"}' };
  }
  return { verdict, message: "", argumentsJson: rest };
}

/** How a held call is put to the person who may decide. */
export const askLine = (tool: string, args: string, rule: string): string =>
  `[approval needed: ${tool} ${args}\n (${rule})\n y: approve, n [reason]: reject, e {json}: run with these arguments]`;
