// Whose sandbox a request is for. The deployment picks the scope (TROUPE_SANDBOX_SCOPE): one
// sandbox per session of its owner (the default), per agent within a tenant, or one per tenant.
// No scope spans tenants, and every key is injective in the ids it is made of (session-ref.ts).
import type { Identity } from "../shared/auth/auth.js";
import { DEFAULT_AGENT } from "../shared/ids.js";
import { fileName } from "../shared/session-ref.js";

export type SandboxScope = "session" | "agent" | "shared";

export function scopeKey(scope: SandboxScope, owner: Identity, sessionId: string, agentId: string): string {
  if (scope === "shared") return `shared:${fileName(owner.tenant)}`;
  if (scope === "agent") return `agent:${fileName(owner.tenant, agentId || DEFAULT_AGENT)}`;
  return `session:${fileName(owner.tenant, owner.principal, sessionId)}`;
}

/** The tenant part of a scope key (as encoded): what quotas count sandboxes by. */
export const tenantOfScopeKey = (key: string): string => key.slice(key.indexOf(":") + 1).split(".")[0];
