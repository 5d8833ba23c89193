// The runner's gauges, read when metrics are collected: sessions in memory, the messages waiting
// in their mailboxes, and the learning queue (the per-call instruments live where the calls are made).
import { instruments } from "../shared/process/metrics.js";
import type { LearningQueue } from "./memory/learning-queue.js";
import type { SessionRegistry } from "./session/session-registry.js";

export function observeSessions(registry: SessionRegistry): void {
  const { meter } = instruments();
  const mailboxes = meter.createObservableGauge("troupe.mailbox.depth", {
    description: "messages waiting in the mailboxes of this runner's sessions",
  });
  const live = meter.createObservableGauge("troupe.sessions.live", { description: "sessions in this runner's memory" });
  meter.addBatchObservableCallback(
    async (r) => {
      const actors = await registry.loaded();
      r.observe(
        mailboxes,
        actors.reduce((n, a) => n + a.waiting, 0),
      );
      r.observe(live, actors.length);
    },
    [mailboxes, live],
  );
}

export function observeLearning(queue: LearningQueue): void {
  const { meter } = instruments();
  const waiting = meter.createObservableGauge("troupe.learning.waiting", {
    description: "completed turns waiting to be learned from (learning waits while the runner is busy)",
  });
  const dropped = meter.createObservableCounter("troupe.learning.dropped", {
    description: "turns not learned from because too many were waiting",
  });
  meter.addBatchObservableCallback(
    (r) => {
      r.observe(waiting, queue.waiting);
      r.observe(dropped, queue.dropped);
    },
    [waiting, dropped],
  );
}
