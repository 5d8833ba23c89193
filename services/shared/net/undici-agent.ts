// undici's Agent and its request API, without the rest of undici. undici's index loads all of it
// (fetch, WebSocket, EventSource, caches, mocks, interceptors): 109 modules that add about 13 MB
// to a bare process's resident memory, where the Agent and its API are 30 modules and about
// 8.5 MB. Troupe sends every outbound HTTP request (model calls, guarded fetches) through an
// Agent's `request`, so it loads those files alone. undici has no "exports" map: these paths are
// its files, and test/unit/undici-agent.test.ts fails if an upgrade moves them.
import { createRequire } from "node:module";
import type { Agent } from "undici";

const require = createRequire(import.meta.url);
let agentClass: typeof Agent | undefined;

/** undici's Agent class, with request, stream and pipeline attached as undici's index attaches them. */
export function undiciAgent(): typeof Agent {
  if (!agentClass) {
    const dispatcher = require("undici/lib/dispatcher/dispatcher.js") as { prototype: object };
    Object.assign(dispatcher.prototype, require("undici/lib/api/index.js"));
    agentClass = require("undici/lib/dispatcher/agent.js") as typeof Agent;
  }
  return agentClass;
}
