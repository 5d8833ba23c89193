// Which store keeps the services' state, from TROUPE_STORE_URL's scheme: the data directory's
// files when it is unset, PostgreSQL for postgres:// and postgresql://. Each service that keeps
// state has a registry by this kind (runner/store/registry.ts, router/membership.ts);
// docs/extending.md says how a store is added.
export type StoreKind = "file" | "postgres";

/** URL schemes, and the store each names. */
const SCHEMES: Readonly<Record<string, StoreKind>> = { postgres: "postgres", postgresql: "postgres" };

/** The store `url` names; "file" for none. Throws, naming the schemes, for a URL no store takes. */
export function storeKind(url: string): StoreKind {
  if (!url) return "file";
  const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(url)?.[1].toLowerCase();
  const kind = scheme ? SCHEMES[scheme] : undefined;
  if (!kind) throw new Error(`TROUPE_STORE_URL: no store takes this URL (schemes: ${Object.keys(SCHEMES).join(", ")})`);
  return kind;
}
