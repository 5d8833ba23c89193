// A broken HTTP peer for bound tests: answers 200 and then sends far more than any reader should
// take, as fast as it is read, and reports whether the reader let the connection go first.
import type http from "node:http";

export interface Flooded {
  /** Bytes written before the connection closed (or the flood ended). */
  sent: number;
  /** The reader closed the connection before the flood ended. */
  cut: boolean;
}

/**
 * Answers with `head`, then `unit` over and over until `total` bytes or until the reader lets go;
 * then ends. Resolves when the connection closes.
 */
export function flood(
  res: http.ServerResponse,
  type: string,
  head: string,
  unit: string,
  total: number,
): Promise<Flooded> {
  return new Promise((resolve) => {
    const chunk = Buffer.from(unit.repeat(Math.ceil(65536 / unit.length)));
    let sent = 0;
    res.on("close", () => resolve({ sent, cut: !res.writableFinished }));
    res.writeHead(200, { "content-type": type });
    res.write(head);
    const more = () => {
      while (!res.destroyed && sent < total) {
        sent += chunk.length;
        if (!res.write(chunk)) return void res.once("drain", more);
      }
      if (!res.destroyed) res.end();
    };
    more();
  });
}
