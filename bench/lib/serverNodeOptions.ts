/**
 * Extra node options for the servers a bench measures, from the environment
 * variable MPCACHE_BENCH_SERVER_NODE_OPTIONS (whitespace-separated), e.g.
 * `--cpu-prof --cpu-prof-dir DIR` or `--import ./my-gc-log.mjs` to see where
 * a server's time goes under the bench's load. Empty when unset. Used by
 * bench:l2 and bench:transfer; the benches' own flags come after these.
 */
export const SERVER_NODE_OPTIONS: ReadonlyArray<string> = (process.env["MPCACHE_BENCH_SERVER_NODE_OPTIONS"] ?? "")
  .split(/\s+/)
  .filter((o) => o !== "")
