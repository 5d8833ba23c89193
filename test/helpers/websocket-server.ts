// The server side of a WebSocket (RFC 6455) for tests, strict where a server must be: the opening
// handshake (section 4.2: GET, Upgrade: websocket, Connection: Upgrade, Sec-WebSocket-Version 13,
// a 16-byte base64 Sec-WebSocket-Key answered with Sec-WebSocket-Accept), frames from a client
// must be masked (5.1: otherwise the connection is failed with 1002), pings are answered with
// pongs (5.5.2), a close is answered with a close (5.5.1). Text messages only, which is all Slack's
// Socket Mode sends; fragmented messages (5.4) are put back together.
import { createHash } from "node:crypto";
import type http from "node:http";
import type { Duplex } from "node:stream";

const GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

export class ServerSocket {
  private buffered = Buffer.alloc(0);
  private fragments: Buffer[] = [];
  closed = false;
  /** The close code the client sent, if it closed. */
  closeCode?: number;
  onText: (text: string) => void = () => undefined;
  onClose: () => void = () => undefined;

  constructor(private readonly socket: Duplex) {
    socket.on("data", (chunk: Buffer) => this.read(chunk));
    socket.on("close", () => this.gone());
    socket.on("error", () => this.gone());
  }

  private silent = false;

  sendText(text: string): void {
    if (!this.closed && !this.silent) this.socket.write(frame(0x1, Buffer.from(text, "utf8")));
  }

  /** From now on nothing passes either way, and nothing closes: a connection a NAT forgot. */
  silence(): void {
    this.silent = true;
  }

  /** Starts the closing handshake; the TCP connection ends once the client answers (or at once with `now`). */
  close(code = 1000, reason = "", now = false): void {
    if (this.closed) return;
    const body = Buffer.alloc(2 + Buffer.byteLength(reason));
    body.writeUInt16BE(code, 0);
    body.write(reason, 2);
    this.socket.write(frame(0x8, body));
    this.closed = true;
    if (now) this.socket.destroy();
    else setTimeout(() => this.socket.destroy(), 1000).unref();
  }

  private notified = false;

  private gone(): void {
    this.closed = true;
    if (this.notified) return;
    this.notified = true;
    this.onClose();
  }

  private read(chunk: Buffer): void {
    if (this.silent) return;
    this.buffered = Buffer.concat([this.buffered, chunk]);
    for (;;) {
      const b = this.buffered;
      if (b.length < 2) return;
      const fin = (b[0]! & 0x80) !== 0;
      const opcode = b[0]! & 0x0f;
      const masked = (b[1]! & 0x80) !== 0;
      let length = b[1]! & 0x7f;
      let at = 2;
      if (length === 126) {
        if (b.length < 4) return;
        length = b.readUInt16BE(2);
        at = 4;
      } else if (length === 127) {
        if (b.length < 10) return;
        length = Number(b.readBigUInt64BE(2));
        at = 10;
      }
      if (!masked) {
        this.close(1002, "client frames must be masked", true);
        return;
      }
      if (b.length < at + 4 + length) return;
      const mask = b.subarray(at, at + 4);
      const payload = Buffer.from(b.subarray(at + 4, at + 4 + length));
      for (let i = 0; i < payload.length; i++) payload[i]! ^= mask[i % 4]!;
      this.buffered = b.subarray(at + 4 + length);
      this.take(fin, opcode, payload);
    }
  }

  private take(fin: boolean, opcode: number, payload: Buffer): void {
    if (opcode === 0x9) return void this.socket.write(frame(0xa, payload));
    if (opcode === 0xa) return;
    if (opcode === 0x8) {
      this.closeCode = payload.length >= 2 ? payload.readUInt16BE(0) : 1005;
      if (!this.closed) this.socket.write(frame(0x8, payload.subarray(0, 2)));
      this.closed = true;
      this.socket.end();
      return;
    }
    if (opcode === 0x1 || opcode === 0x0) {
      this.fragments.push(payload);
      if (!fin) return;
      const text = Buffer.concat(this.fragments).toString("utf8");
      this.fragments = [];
      this.onText(text);
      return;
    }
    this.close(1003, "only text frames are taken", true);
  }
}

/** An unmasked frame, as a server sends them. */
function frame(opcode: number, payload: Buffer): Buffer {
  const n = payload.length;
  const head = n < 126 ? Buffer.alloc(2) : n < 65536 ? Buffer.alloc(4) : Buffer.alloc(10);
  head[0] = 0x80 | opcode;
  if (n < 126) head[1] = n;
  else if (n < 65536) {
    head[1] = 126;
    head.writeUInt16BE(n, 2);
  } else {
    head[1] = 127;
    head.writeBigUInt64BE(BigInt(n), 2);
  }
  return Buffer.concat([head, payload]);
}

/**
 * Completes the opening handshake of an `upgrade` request, or answers it with an HTTP error.
 * Returns the socket, or undefined when the request was refused.
 */
export function acceptWebSocket(req: http.IncomingMessage, socket: Duplex, refuse?: number): ServerSocket | undefined {
  const key = req.headers["sec-websocket-key"];
  const bad =
    req.method !== "GET" ||
    String(req.headers.upgrade).toLowerCase() !== "websocket" ||
    !/\bupgrade\b/i.test(String(req.headers.connection)) ||
    req.headers["sec-websocket-version"] !== "13" ||
    typeof key !== "string" ||
    Buffer.from(key, "base64").length !== 16;
  const status = bad ? 400 : refuse;
  if (status) {
    socket.end(`HTTP/1.1 ${status} ${status === 400 ? "Bad Request" : "Refused"}\r\nConnection: close\r\n\r\n`);
    return undefined;
  }
  const accept = createHash("sha1")
    .update(key + GUID)
    .digest("base64");
  socket.write(
    `HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n\r\n`,
  );
  return new ServerSocket(socket);
}
