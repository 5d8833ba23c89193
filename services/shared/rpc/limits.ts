// Limits shared by servers and clients (explicit, so other stacks can match them).
import type * as grpc from "@grpc/grpc-js";

export const DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024;
export const DEFAULT_DEADLINE_MS = 10_000;

export function channelOptions(maxMessageBytes: number): grpc.ChannelOptions {
  return {
    "grpc.max_receive_message_length": maxMessageBytes,
    "grpc.max_send_message_length": maxMessageBytes,
    // Pings no more often than other gRPC stacks accept by default (5 min).
    "grpc.keepalive_time_ms": 300_000,
    "grpc.keepalive_timeout_ms": 20_000,
    "grpc.enable_channelz": 0,
  };
}
