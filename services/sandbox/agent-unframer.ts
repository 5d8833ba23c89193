// The bytes an in-sandbox agent sends, cut into its frames. Docker wraps the container's output
// in 8-byte headers (stream, length): those are unwrapped first, and stderr is handed on as
// diagnostics. Stdout carries the agent's frames (length, type, request id, payload), read from
// the sync marker on. The other end is untrusted: every length is checked against its cap before
// anything is waited for, and bytes that are not the protocol throw a ProtocolViolation, which
// ends the connection (agent-connection.ts).
import { MAX_DOCKER_CHUNK, MAX_FRAME, SYNC_MAGIC } from "./agent-frames.js";
import { ChunkWait } from "./chunk-wait.js";

/** What the agent sent is not the protocol: the connection ends, and the sandbox with it. */
export class ProtocolViolation extends Error {}

export function violation(message: string): never {
  throw new ProtocolViolation(message);
}

/** Where the unframer hands what it reads. */
export interface UnframerSink {
  /** A chunk of the agent's stderr. */
  stderr(text: string): void;
  /** One whole frame; the payload is a copy, free to outlive the chunk it came in. May throw. */
  frame(type: number, id: number, payload: Buffer): void;
  /** Whether the connection has ended (handling a frame may end it): reading stops there. */
  stopped(): boolean;
}

export class AgentUnframer {
  /** Docker's framing not yet complete, and the chunks held until it is. */
  private raw: Buffer = Buffer.alloc(0);
  private readonly rawWait = new ChunkWait();
  /** The agent's frames not yet complete, and the chunks held until they are. */
  private buf: Buffer = Buffer.alloc(0);
  private readonly bufWait = new ChunkWait();
  /** Until the agent's reply to our HELLO, bytes are skipped up to the sync marker. */
  private synced = false;

  constructor(private readonly sink: UnframerSink) {}

  /** Skips to the next sync marker: what follows a new HELLO starts with one. */
  resync(): void {
    this.synced = false;
  }

  /** The next chunk of the container's attached output. Throws what is not the protocol. */
  push(chunk: Buffer): void {
    const joined = this.rawWait.join(this.raw, chunk);
    if (!joined) return;
    this.raw = joined;
    while (this.raw.length >= 8 && !this.sink.stopped()) {
      const stream = this.raw[0];
      const size = this.raw.readUInt32BE(4);
      if (stream !== 1 && stream !== 2) violation(`a chunk on stream ${stream}`);
      if (size > MAX_DOCKER_CHUNK) violation(`a chunk of ${size} bytes`);
      if (this.raw.length < 8 + size) {
        this.rawWait.want(8 + size - this.raw.length);
        break;
      }
      const body = this.raw.subarray(8, 8 + size);
      this.raw = this.raw.subarray(8 + size);
      if (stream === 2) this.sink.stderr(body.toString("utf8"));
      else this.onFrames(body);
    }
  }

  private onFrames(chunk: Buffer): void {
    const joined = this.bufWait.join(this.buf, chunk);
    if (!joined) return;
    this.buf = joined;
    if (!this.synced) {
      // Bytes of frames meant for an earlier connection may come first: skip to the marker.
      const at = this.buf.indexOf(SYNC_MAGIC);
      if (at < 0) {
        this.buf = this.buf.subarray(Math.max(0, this.buf.length - SYNC_MAGIC.length + 1));
        return;
      }
      this.buf = this.buf.subarray(at + SYNC_MAGIC.length);
      this.synced = true;
    }
    while (this.buf.length >= 4 && !this.sink.stopped()) {
      const len = this.buf.readUInt32BE(0);
      // Checked before waiting for it: a huge claim is refused now, not buffered for.
      if (len < 5 || len > MAX_FRAME) violation(`a frame of ${len} bytes`);
      if (this.buf.length < 4 + len) {
        this.bufWait.want(4 + len - this.buf.length);
        break;
      }
      const type = this.buf[4]!;
      const id = this.buf.readUInt32BE(5);
      const payload = Buffer.from(this.buf.subarray(9, 4 + len));
      this.buf = this.buf.subarray(4 + len);
      this.sink.frame(type, id, payload);
    }
  }
}
