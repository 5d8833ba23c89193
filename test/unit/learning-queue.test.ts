// Learning waits while the runner is busy: a few at a time when idle, one after a pause when busy,
// the oldest dropped past the bound, nothing started after close. The load is injected; the
// timers are real.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";
import { LearningQueue } from "../../services/runner/memory/learning-queue.js";
import type { Logger } from "../../services/shared/process/log.js";

interface Line {
  level: string;
  message: string;
  fields?: Record<string, unknown>;
}

function recordingLogger(lines: Line[]): Logger {
  const at =
    (level: string) =>
    (message: string, fields?: Record<string, unknown>): void =>
      void lines.push({ level, message, fields });
  return { debug: at("debug"), info: at("info"), warn: at("warn"), error: at("error") };
}

/** A job that records its start and finishes when told. */
function gatedJobs() {
  const started: number[] = [];
  const finishers = new Map<number, () => void>();
  const job = (n: number) => () => {
    started.push(n);
    return new Promise<void>((resolve) => finishers.set(n, resolve));
  };
  return { started, job, finish: (n: number) => finishers.get(n)?.() };
}

describe("LearningQueue", () => {
  test("while the runner is idle, jobs run at once, up to the concurrency, and the next starts as one ends", async () => {
    const q = new LearningQueue(recordingLogger([]), { concurrency: 2, load: () => 0 });
    const { started, job, finish } = gatedJobs();
    for (let n = 1; n <= 4; n++) q.add(job(n));
    assert.deepEqual(started, [1, 2]);
    assert.equal(q.running, 2);
    assert.equal(q.waiting, 2);
    finish(1);
    await sleep(0);
    assert.deepEqual(started, [1, 2, 3]);
    q.close();
  });

  test("while busy, one job starts only after the pause with none running; when the load falls, the rest go", async () => {
    let load = 0.9;
    const q = new LearningQueue(recordingLogger([]), {
      concurrency: 2,
      busyAbove: 0.5,
      trickleMs: 150,
      sampleMs: 20,
      load: () => load,
    });
    const { started, job, finish } = gatedJobs();
    // No job has started yet, so no pause is owed: one starts at once.
    q.add(job(1));
    q.add(job(2));
    q.add(job(3));
    assert.deepEqual(started, [1], "busy: one at a time");
    finish(1);
    await sleep(50);
    assert.deepEqual(started, [1], "busy: the next waits for the pause");
    await sleep(200);
    assert.deepEqual(started, [1, 2], "busy: one more after the pause");
    load = 0.1;
    await sleep(60);
    assert.deepEqual(started, [1, 2, 3], "idle again: the rest start");
    q.close();
  });

  test("past the bound the oldest waiting job is dropped, counted and said once per hundred", async () => {
    const lines: Line[] = [];
    const q = new LearningQueue(recordingLogger(lines), { concurrency: 1, maxWaiting: 3, load: () => 0 });
    const { started, job, finish } = gatedJobs();
    for (let n = 1; n <= 6; n++) q.add(job(n));
    // 1 runs; 2..6 queued with room for 3: 2 and 3 dropped.
    assert.equal(q.dropped, 2);
    assert.equal(q.waiting, 3);
    assert.equal(lines.filter((l) => l.level === "warn").length, 1);
    for (let n = 1; n <= 6; n++) {
      finish(n);
      await sleep(0);
    }
    assert.deepEqual(started, [1, 4, 5, 6]);
    q.close();
  });

  test("a job that throws or rejects does not stop the queue", async () => {
    const q = new LearningQueue(recordingLogger([]), { concurrency: 1, load: () => 0 });
    const ran: string[] = [];
    q.add(() => {
      ran.push("throws");
      throw new Error("boom");
    });
    q.add(() => {
      ran.push("rejects");
      return Promise.reject(new Error("no"));
    });
    q.add(async () => void ran.push("runs"));
    await sleep(10);
    assert.deepEqual(ran, ["throws", "rejects", "runs"]);
    assert.equal(q.running, 0);
    q.close();
  });

  test("close drops what waits, says how many, and starts nothing more", async () => {
    const q = new LearningQueue(recordingLogger([]), { concurrency: 1, load: () => 0 });
    const { started, job, finish } = gatedJobs();
    q.add(job(1));
    q.add(job(2));
    q.add(job(3));
    assert.equal(q.close(), 2);
    finish(1);
    q.add(job(4));
    await sleep(10);
    assert.deepEqual(started, [1]);
  });

  test("the default load is the event loop's: a loop kept busy counts as busy", async () => {
    const q = new LearningQueue(recordingLogger([]), { concurrency: 2, trickleMs: 10_000, sampleMs: 50 });
    const { started, job } = gatedJobs();
    // Keep the loop busy across a whole sample window, then queue: only one may start.
    const until = performance.now() + 120;
    while (performance.now() < until);
    q.add(job(1));
    q.add(job(2));
    assert.deepEqual(started, [1]);
    q.close();
  });
});
