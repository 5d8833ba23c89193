// The house rules `make lint` holds the code to (dependency-cruiser, over the compiled-from
// sources: TypeScript's own resolution, type imports included):
//   - no import cycle anywhere;
//   - a service imports only itself and services/shared; the CLI (services/cli) is the one
//     composition root that may import every service, and nothing imports it back;
//   - nothing under services/ imports test/ or bench/.
// A new folder under services/ is a service: the rules hold for it with no edit here.
const SERVICES = "(adapter|dev|gateway|memory|router|runner|sandbox)";
module.exports = {
  forbidden: [
    {
      name: "no-cycles",
      severity: "error",
      comment: "Data flows one way: a cycle means two modules each need the other; move the shared part below both.",
      from: {},
      to: { circular: true },
    },
    {
      name: "services-stay-in-their-room",
      severity: "error",
      comment: "A service reaches another through gRPC, not its files; what both need belongs in services/shared.",
      from: { path: `^services/${SERVICES}/` },
      to: { path: "^services/([^/]+)/", pathNot: ["^services/$1/", "^services/shared/"] },
    },
    {
      name: "shared-is-the-floor",
      severity: "error",
      comment: "services/shared is below every service: it imports none of them.",
      from: { path: "^services/shared/" },
      to: { path: "^services/", pathNot: "^services/shared/" },
    },
    {
      name: "no-tests-in-services",
      severity: "error",
      from: { path: "^services/" },
      to: { path: "^(test|bench)/" },
    },
  ],
  options: {
    doNotFollow: { path: "node_modules" },
    exclude: { path: "(^|/)(node_modules|dist)/" },
    // TypeScript 7's compiler has no API to parse with, so sources are read by swc, which keeps
    // type-only imports (a cycle through types is a cycle too).
    parser: "swc",
    tsPreCompilationDeps: true,
    tsConfig: { fileName: "tsconfig.json" },
  },
};
