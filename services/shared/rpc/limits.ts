// Limits shared by servers and clients (explicit, so other stacks can match them).
import type * as grpc from "@grpc/grpc-js";

export const DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024;
export const DEFAULT_DEADLINE_MS = 10_000;

/**
 * What a client lets its server send before the client reads, per stream and for the whole
 * connection (every stream on it shares that one). grpc-js's default is HTTP/2's 65,535 bytes for
 * both; with it, under load, a gateway's streams from its runner stalled for seconds and some were
 * cut after 30 s (bench/history.md, "The receive window"). 1 MiB is grpc-java's default.
 */
export const RECEIVE_WINDOW_BYTES = 1024 * 1024;

/** Longest reconnect backoff with grpc-js's 20% jitter, and a margin: what a retry waits for a peer. */
export const RECONNECT_WAIT_MS = 2_500;

export function channelOptions(maxMessageBytes: number): grpc.ChannelOptions {
  return {
    "grpc.max_receive_message_length": maxMessageBytes,
    "grpc.max_send_message_length": maxMessageBytes,
    // Pings no more often than other gRPC stacks accept by default (5 min).
    "grpc.keepalive_time_ms": 300_000,
    "grpc.keepalive_timeout_ms": 20_000,
    "grpc.enable_channelz": 0,
    // Peers restart (a rolling update, a crash and its restart). grpc-js backs off up to 120 s
    // between reconnects, and calls in between fail at once with UNAVAILABLE even when the peer
    // is back: a gateway then failed calls to a restarted runner long after it was serving. A
    // 2 s cap costs at most one connection attempt every 2 s to a peer that stays down.
    "grpc.initial_reconnect_backoff_ms": 250,
    "grpc.max_reconnect_backoff_ms": 2000,
  };
}
