/**
 * The one gate of the L2 suites (issue 15: "skipping only the L2 suites with
 * a loud line saying so — never silently"): `redisSuite(name, fn)` is
 * `describe(name, fn)` when redis-server and redis-cli exist, and otherwise a
 * skipped describe plus a line on the process's own stderr (the vitest config
 * silences console output of passing files, so console.warn alone is not
 * enough).
 */
import { describe } from "@effect/vitest"
import { REDIS_CLI, REDIS_SERVER, redisAvailable } from "./RedisFleet.ts"

/** What is printed when the binaries are missing. */
export const REDIS_MISSING =
  `L2 suites SKIPPED: redis-server not found (${REDIS_SERVER}, ${REDIS_CLI}); CI installs it with apt-get install -y redis-server (.ci/run does)`

let warned = false

/** `describe(name, fn)`, or a loudly skipped one when Redis is not installed. */
export const redisSuite = (name: string, fn: () => void) => {
  const available = redisAvailable()
  if (!available && !warned) {
    warned = true
    process.stderr.write(`\n*** ${REDIS_MISSING} ***\n\n`)
    console.warn(REDIS_MISSING)
  }
  describe.skipIf(!available)(`${name}${available ? "" : " (SKIPPED: no redis-server)"}`, fn)
}
