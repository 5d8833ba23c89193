// Group commit: requests that arrive while the writer is busy wait, and go together in its next
// turn, as one commit of the table. LanceDB's cost is per commit, not per row: a commit writes a
// manifest and a new version, and each commit keeps native memory (about 70 KB of RSS for a
// one-row commit against about 10 KB per row in a commit of ten; bench/history.md,
// bench/lance-growth). Nothing waits on purpose: a lone request is committed at once, and a
// group forms only from the requests that queued behind a commit already under way.

/** What a group's commit settles each request with: its result, or its own refusal. */
export type Settled<Res> = { ok: Res } | { error: unknown };

interface Waiting<Req, Res> {
  request: Req;
  resolve: (res: Res) => void;
  reject: (err: unknown) => void;
}

export class GroupCommit<Req, Res> {
  private waiting: Waiting<Req, Res>[] = [];
  private scheduled = false;

  /**
   * @param commit commits a group; answers each request in order, or throws (every request of
   *   the group then fails with that error). May be called again with the same group (a retried
   *   commit conflict), so it must not assume it runs once.
   * @param enqueue runs a turn of the table's one writer after every earlier one (MemoryTable.write).
   * @param maxGroup the most requests one commit takes (1, or less: a commit per request).
   */
  constructor(
    private readonly commit: (group: Req[]) => Promise<Settled<Res>[]>,
    private readonly enqueue: (turn: () => Promise<void>) => Promise<void>,
    private readonly maxGroup: number,
  ) {}

  submit(request: Req): Promise<Res> {
    const answer = new Promise<Res>((resolve, reject) => this.waiting.push({ request, resolve, reject }));
    this.schedule();
    return answer;
  }

  private schedule(): void {
    if (this.scheduled || this.waiting.length === 0) return;
    this.scheduled = true;
    let group: Waiting<Req, Res>[] | undefined;
    const turn = async () => {
      // Taken when the writer gets to it, once: a retried turn commits the same group.
      if (!group) {
        group = this.waiting.splice(0, Math.max(1, this.maxGroup));
        this.scheduled = false;
        // Whatever arrives from now on (or was left over the limit) goes in the next turn.
        this.schedule();
      }
      const settled = await this.commit(group.map((w) => w.request));
      group.forEach((w, i) => {
        const s = settled[i];
        if ("ok" in s) w.resolve(s.ok);
        else w.reject(s.error);
      });
    };
    this.enqueue(turn).catch((err: unknown) => {
      if (!group) {
        group = this.waiting.splice(0);
        this.scheduled = false;
      }
      for (const w of group) w.reject(err);
    });
  }
}
