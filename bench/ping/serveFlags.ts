/**
 * The `mpcache serve` flags both PING benchmarks start their server with (bench/ping/ping.ts, bench/ping/profile.ts):
 * `endpoint`, an ephemeral HTTP port, JSON logs, no L1 prefault (the benchmarks measure PINGs, not the pool).
 */
export const SERVE_FLAGS = (endpoint: string): Array<string> => ["--endpoint", endpoint, "--http-port", "0", "--log-format", "json", "--no-l1-prefault"]
