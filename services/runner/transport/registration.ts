// The runner's place in the router's list: registered at start, renewed at a third of the lease,
// and marked draining on the way out so the router places no new session here.
import type { RouterService } from "../../shared/gen/troupe/v1/router_pb.js";
import type { Logger } from "../../shared/process/log.js";
import type { ServiceClient } from "../../shared/rpc.js";

/** How long registration may fail before it is worth a warning. */
const WARN_AFTER_MS = 3000;

/** Registers the runner with the router and renews the lease until stopped. */
export function registerWithRouter(
  router: ServiceClient<(typeof RouterService)["method"]>,
  runnerId: string,
  address: string,
  logger: Logger,
) {
  let stopped = false;
  let timer: NodeJS.Timeout | undefined;
  let registered = false;
  let failingSince: number | undefined;
  let warned = false;
  const beat = async () => {
    if (stopped) return;
    let next = 1000;
    try {
      const res = await router.registerRunner({ runner: { runnerId, address } }, { timeoutMs: 2000 });
      if (!registered) logger.info("registered with the router", { address });
      else if (warned) logger.info("registered with the router again");
      registered = true;
      failingSince = undefined;
      warned = false;
      next = Math.max(200, Math.floor(res.leaseTtlMs / 3));
    } catch (err) {
      // Services started together come up in any order: a router still starting is not news.
      failingSince ??= Date.now();
      const failingMs = Date.now() - failingSince;
      if (!warned && failingMs >= WARN_AFTER_MS) {
        logger.warn(`cannot reach the router for ${Math.round(failingMs / 1000)} s; retrying`, {
          error: (err as Error).message,
        });
        warned = true;
      }
    }
    if (!stopped) timer = setTimeout(beat, next);
  };
  void beat();
  return {
    async stop() {
      stopped = true;
      clearTimeout(timer);
      await router
        .registerRunner({ runner: { runnerId, address }, draining: true }, { timeoutMs: 1000 })
        .catch(() => undefined);
    },
  };
}
