// A command's connection to its sandbox's egress port, on the service's side: a Duplex whose
// bytes travel as frames on the agent's channel (sandbox/agent/egress.c, agent.h for the frames).
// Credit runs both ways, so neither side holds more than a window of a connection: the agent
// sends at most NET_WINDOW bytes until they are credited (here, as the reader takes them), and
// this side sends at most NET_WINDOW bytes until the agent says it has written them.
//
// The agent is inside the sandbox: what it says of connections is checked like everything else
// it says (connection ids, counts, windows), and a violation ends the whole agent connection.
import { Duplex } from "node:stream";

/** CONN_WINDOW and EGRESS_MAX_CONNS in the agent. */
export const NET_WINDOW = 256 * 1024;
export const MAX_CONNECTIONS = 32;
/** Connection ids are the agent's, from here up; request ids stay below. */
const CONNECTION_ID_BASE = 0x8000_0000;
const PIECE_BYTES = 64 * 1024;

export enum NetReq {
  Send = 12,
  Credit = 13,
  End = 14,
}

export enum NetRep {
  Open = 71,
  Data = 72,
  Written = 73,
  End = 74,
}

export type SendFrame = (type: NetReq, id: number, ...parts: Uint8Array[]) => void;

const u32 = (v: number) => {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(v >>> 0);
  return b;
};

export class AgentSocket extends Duplex {
  /** Sent to the agent, not yet written to the command. */
  private inFlight = 0;
  /** A write waiting for the window to open. */
  private waiting: (() => void) | undefined;
  /** Received from the agent, not yet credited back. */
  owed = 0;
  /** The agent has dropped the connection: nothing more goes to it. */
  private goneAtAgent = false;

  constructor(
    readonly connectionId: number,
    private readonly send: SendFrame,
    private readonly forget: (id: number) => void,
  ) {
    super({ allowHalfOpen: true });
  }

  /** Bytes the command sent. */
  received(data: Buffer): void {
    this.owed += data.length;
    if (this.push(data)) this.creditOwed();
  }

  /** The agent wrote this much of what was sent to the command. */
  written(bytes: number): void {
    this.inFlight -= bytes;
    const resume = this.waiting;
    this.waiting = undefined;
    resume?.();
  }

  /** The command will send nothing more (how 0), or the connection is gone (how 1). */
  ended(how: number): void {
    if (how === 0) this.push(null);
    else {
      this.goneAtAgent = true;
      this.destroy();
    }
  }

  /** Bytes this side has sent that the agent has not written yet. */
  get unwritten(): number {
    return this.inFlight;
  }

  override _read(): void {
    this.creditOwed();
  }

  override _write(chunk: Buffer, _encoding: BufferEncoding, done: (err?: Error | null) => void): void {
    let off = 0;
    const more = () => {
      while (off < chunk.length) {
        if (this.destroyed) return;
        const room = NET_WINDOW - this.inFlight;
        if (room <= 0) {
          this.waiting = more;
          return;
        }
        const n = Math.min(room, chunk.length - off, PIECE_BYTES);
        this.send(NetReq.Send, this.connectionId, chunk.subarray(off, off + n));
        this.inFlight += n;
        off += n;
      }
      done();
    };
    more();
  }

  override _final(done: (err?: Error | null) => void): void {
    if (!this.goneAtAgent) this.send(NetReq.End, this.connectionId, Buffer.from([0]));
    done();
  }

  override _destroy(err: Error | null, done: (err?: Error | null) => void): void {
    if (!this.goneAtAgent) this.send(NetReq.End, this.connectionId, Buffer.from([1]));
    this.goneAtAgent = true;
    this.forget(this.connectionId);
    done(err);
  }

  private creditOwed() {
    if (this.owed === 0 || this.goneAtAgent) return;
    this.send(NetReq.Credit, this.connectionId, u32(this.owed));
    this.owed = 0;
  }
}

/** One agent connection's egress connections: what the agent says of them, checked and passed on. */
export class AgentSockets {
  private readonly open = new Map<number, AgentSocket>();

  constructor(
    private readonly send: SendFrame,
    /** A new connection; without a taker it is closed at once. */
    private readonly accept: ((socket: AgentSocket) => void) | undefined,
  ) {}

  static isNetReply(type: number): boolean {
    return type >= NetRep.Open && type <= NetRep.End;
  }

  /** Handles one frame; returns why it breaks the protocol, if it does. */
  dispatch(type: NetRep, id: number, payload: Buffer): string | undefined {
    if (id < CONNECTION_ID_BASE) return `connection id ${id} is in the request range`;
    const socket = this.open.get(id);
    if (type === NetRep.Open) {
      if (socket) return `connection ${id} opened twice`;
      if (this.open.size >= MAX_CONNECTIONS) return `more than ${MAX_CONNECTIONS} connections open`;
      const fresh = new AgentSocket(id, this.send, (gone) => this.open.delete(gone));
      this.open.set(id, fresh);
      if (this.accept) this.accept(fresh);
      else fresh.destroy();
      return undefined;
    }
    // Frames for a connection this side has closed may still be on their way: not an error.
    if (!socket) return undefined;
    if (type === NetRep.Data) {
      if (socket.owed + payload.length > NET_WINDOW) return `connection ${id} sent past its credit window`;
      socket.received(payload);
    } else if (type === NetRep.Written) {
      if (payload.length !== 4) return "a written count that is not 4 bytes";
      const bytes = payload.readUInt32BE(0);
      if (bytes > socket.unwritten) return `connection ${id} wrote more than it was sent`;
      socket.written(bytes);
    } else {
      if (payload.length !== 1 || payload[0] > 1) return "a connection end without its kind";
      socket.ended(payload[0]);
    }
    return undefined;
  }

  /** The agent connection ended: so did every egress connection on it. */
  endAll(): void {
    for (const socket of [...this.open.values()]) socket.ended(1);
  }
}
