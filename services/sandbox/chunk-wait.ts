// The agent connection reads units that can span many of the chunks they arrive in: Docker's
// chunks of the container's output, and the agent's frames inside them (up to 17 MB, a file
// read). Joining every chunk to what was waiting copied a unit's bytes once per chunk, so a
// 3.9 MB file read in Docker's 32 KB chunks copied about 250 MB, and reads grew with the square
// of their size (bench/history.md, bench/sandbox). Chunks now wait in a list until the unit
// they belong to is whole, and are joined once.

/** Chunks held back until the unit being read has all its bytes. */
export class ChunkWait {
  private parts: Buffer[] = [];
  private held = 0;
  private short = 0;

  /** The unit being read needs `bytes` more than the parser has; hold chunks until they come. */
  want(bytes: number): void {
    this.short = bytes;
  }

  /**
   * `rest` (what the last parse left) joined with the held chunks and `chunk`, to parse now; or
   * undefined, `chunk` held, while the unit is still short.
   */
  join(rest: Buffer, chunk: Buffer): Buffer | undefined {
    if (this.held + chunk.length < this.short) {
      this.parts.push(chunk);
      this.held += chunk.length;
      return undefined;
    }
    const all = rest.length === 0 && this.held === 0 ? chunk : Buffer.concat([rest, ...this.parts, chunk]);
    this.parts = [];
    this.held = 0;
    this.short = 0;
    return all;
  }
}
