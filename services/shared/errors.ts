// Errors that cross a gRPC boundary. Handlers throw RpcError with the status a caller should see;
// anything else thrown is a bug and reaches the caller as INTERNAL without its message.
import { Metadata, status as Status } from "@grpc/grpc-js";
import {
  addErrorInfo,
  addRetryDetails,
  ERROR_DOMAIN,
  PUSHBACK_TRAILER,
  STATUS_DETAILS_TRAILER,
} from "./retry-details.js";

export { Status };

export class RpcError extends Error {
  constructor(
    readonly code: Status,
    message: string,
  ) {
    super(message);
    this.name = "RpcError";
  }

  /** Trailing metadata the caller receives with the status (for example where to retry). */
  get trailers(): Record<string, string> {
    return {};
  }

  /** A stable reason for ErrorInfo (UPPER_SNAKE_CASE), where the refusal has one. */
  get reason(): string | undefined {
    return undefined;
  }

  /** Whose reasons `reason` is one of (ErrorInfo.domain). */
  get domain(): string {
    return ERROR_DOMAIN;
  }
}

export const invalidArgument = (msg: string) => new RpcError(Status.INVALID_ARGUMENT, msg);
export const notFound = (msg: string) => new RpcError(Status.NOT_FOUND, msg);
export const permissionDenied = (msg: string) => new RpcError(Status.PERMISSION_DENIED, msg);
export const failedPrecondition = (msg: string) => new RpcError(Status.FAILED_PRECONDITION, msg);
export const resourceExhausted = (msg: string) => new RpcError(Status.RESOURCE_EXHAUSTED, msg);
export const unavailable = (msg: string) => new RpcError(Status.UNAVAILABLE, msg);

/**
 * Trailing metadata with which a runner refuses a session that is live on another runner
 * (status ABORTED): the owner's address, where the gateway retries.
 */
export const SESSION_OWNER_KEY = "troupe-session-owner";

/** The status name of a numeric code, e.g. 14 -> "UNAVAILABLE". */
export function statusName(code: number): string {
  return Status[code] ?? `CODE_${code}`;
}

/** The gRPC status carried by an error from a grpc-js client call, if it is one. */
export function grpcCode(err: unknown): Status | undefined {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === "number" ? code : undefined;
}

/** Converts a thrown value into the status object grpc-js sends. */
/** The trailer a refusal that may succeed later carries: milliseconds to wait (rate.ts sets it). */
export const RETRY_AFTER_TRAILER = "retry-after-ms";

export function toStatus(err: unknown): { code: Status; details: string; metadata?: Metadata } {
  if (err instanceof RpcError) {
    const entries = Object.entries(err.trailers);
    if (entries.length === 0 && err.reason === undefined) return { code: err.code, details: err.message };
    const metadata = new Metadata();
    for (const [k, v] of entries) metadata.set(k, v);
    const retry = err.trailers[RETRY_AFTER_TRAILER];
    if (retry !== undefined)
      addRetryDetails(metadata, err.code, err.message, Number(retry), err.reason ?? "RETRY_LATER");
    else if (err.reason !== undefined) addErrorInfo(metadata, err.code, err.message, err.reason, err.domain);
    return { code: err.code, details: err.message, metadata };
  }
  const code = grpcCode(err);
  // A failed downstream call keeps its status: the caller learns UNAVAILABLE, not INTERNAL. Of
  // its trailers only the client's contract passes on (a retry hint); the rest are between
  // services (a session owner's internal address) and stay inside.
  if (code !== undefined && code !== Status.OK) {
    const details = (err as { details?: string }).details ?? String(err);
    const from = (err as { metadata?: Metadata }).metadata;
    const retry = from?.get(RETRY_AFTER_TRAILER)[0];
    if (retry === undefined) return { code, details };
    const metadata = new Metadata();
    metadata.set(RETRY_AFTER_TRAILER, String(retry));
    // The service that refused said why (retry-details.ts): its details pass on as they are.
    const said = from?.get(STATUS_DETAILS_TRAILER)[0];
    if (Buffer.isBuffer(said)) {
      metadata.set(PUSHBACK_TRAILER, String(retry));
      metadata.set(STATUS_DETAILS_TRAILER, said);
    } else addRetryDetails(metadata, code, details, Number(retry), "RETRY_LATER");
    return { code, details, metadata };
  }
  return { code: Status.INTERNAL, details: "internal error" };
}

/** A failed call as a command-line tool reports it: the status's name and details, else the message. */
export function describeError(err: unknown): string {
  const e = err as { code?: number; details?: string; message?: string };
  // gRPC errors carry a numeric code and details; anything else (file system, LanceDB) its message.
  return typeof e.code === "number" ? `${statusName(e.code)}: ${e.details ?? e.message}` : String(e.message ?? err);
}

/** Throws INVALID_ARGUMENT with `message` when `condition` holds. */
export function invalidArgumentIf(condition: boolean, message: string): void {
  if (condition) throw invalidArgument(message);
}
