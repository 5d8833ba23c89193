// The wire between the sandbox service and its in-sandbox agent (sandbox/agent/troupe-agent.c):
// frames of u32 length (of what follows), u8 type, u32 request id, payload; big-endian. Requests
// go to the agent, replies come back; the egress socket's frames are agent-socket.ts's.
export const AGENT_VERSION = "troupe-agent/1";
export const SYNC_MAGIC = Buffer.from("\0TRPSYNC", "latin1");
/** The largest frame either side sends: a 16 MiB file plus its header (MAX_FRAME in the agent). */
export const MAX_FRAME = 17 << 20;
/** Docker's own chunks of the container's output are far smaller; anything larger is not Docker. */
export const MAX_DOCKER_CHUNK = MAX_FRAME + 64 * 1024;

export enum Req {
  Hello = 1,
  Claim = 2,
  Exec = 3,
  Stdin = 4,
  StdinClose = 5,
  Signal = 6,
  Credit = 7,
  KillAll = 8,
  Read = 9,
  Write = 10,
  List = 11,
}

export enum Rep {
  Hello = 64,
  Ok = 65,
  Err = 66,
  Out = 67,
  Exit = 68,
  File = 69,
  Listing = 70,
}

/** One frame: its header, then the parts of its payload. */
export function frame(type: number, id: number, ...parts: Uint8Array[]): Buffer {
  const len = parts.reduce((n, p) => n + p.length, 0);
  const head = Buffer.alloc(9);
  head.writeUInt32BE(5 + len, 0);
  head.writeUInt8(type, 4);
  head.writeUInt32BE(id, 5);
  return Buffer.concat([head, ...parts]);
}

/** A u32, big-endian, as the payloads carry numbers. */
export const u32 = (v: number) => {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(v >>> 0);
  return b;
};
