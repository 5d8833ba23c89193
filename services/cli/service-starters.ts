// Each service's starter, imported only when that service runs in this process.
import type { ServiceStarter } from "../shared/process/service.js";

export const SERVICES: Record<string, () => Promise<ServiceStarter>> = {
  gateway: async () => (await import("../gateway/server.js")).startGateway,
  router: async () => (await import("../router/server.js")).startRouter,
  runner: async () => (await import("../runner/server.js")).startRunner,
  memory: async () => (await import("../memory/server.js")).startMemory,
  sandbox: async () => (await import("../sandbox/server.js")).startSandbox,
};
