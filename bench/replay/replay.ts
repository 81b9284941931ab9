/**
 * `node bench/replay/replay.ts [-- --quick | --full] [-- --summary FILE]` (run by
 * `npm run bench`; `npm run replay` runs the replay alone, without this report)
 *
 * `mpcache replay` of the Mooncake conversation trace, small model,
 * `--max-rate` (300 requests; 1,000 with `--full`), run in a child process
 * with `--json`: requests/s and where a request's time goes. `--write-docs`
 * rewrites the section "## Replay (mpcache replay)" of docs/benchmarks.md;
 * `--summary FILE` writes its row as JSON for bench/suite.ts; `--check`
 * exits 1 when the run was not clean.
 *
 * A benchmark, never a test: exits 0 when the replay exited 0, 1 otherwise
 * (its row, when it printed its JSON, says whether it was clean).
 */
import { parseBenchArgs } from "../lib/args.ts"
import { runNode } from "../lib/children.ts"
import { measuredDate } from "../lib/machine.ts"
import { finishBench } from "../lib/outcome.ts"

const HEADING = "## Replay (mpcache replay)"

const args = parseBenchArgs({})
/** Trace requests replayed: quick / full. */
const REPLAY_REQUESTS = args.full ? 1_000 : 300

interface Stage {
  readonly p50: number
  readonly p99: number
  readonly mean: number
}
/** The fields of `mpcache replay --json` this bench reads. */
interface ReplayJson {
  readonly requests: number
  readonly failed_requests: number
  readonly duration_seconds: number
  readonly requests_per_second: number
  readonly workers: number
  readonly model: string
  readonly chunk_size: number
  readonly hit_ratio: number
  readonly perfect_lru_hit_ratio: number
  readonly gb_stored: number
  readonly gb_retrieved: number
  readonly leaked_contexts: number
  readonly open_mappings_after_shutdown: number
  readonly data_mismatches: number
  readonly latency_ms: Record<"lookup" | "retrieve" | "compute" | "store" | "request", Stage>
}

const section = (r: ReplayJson, argv: ReadonlyArray<string>): string => {
  const l = r.latency_ms
  const share = (ms: number) => `${((100 * ms) / Math.max(l.request.mean, 1e-9)).toFixed(0)} %`
  const row = (name: string, s: Stage) => `| ${name} | ${s.mean.toFixed(1)} | ${share(s.mean)} | ${s.p50.toFixed(1)} | ${s.p99.toFixed(1)} |`
  return [
    HEADING,
    "",
    `Measured ${measuredDate()} · \`mpcache ${argv.slice(1).join(" ")}\``,
    "",
    `${r.requests} requests of the Mooncake conversation trace (${r.failed_requests} failed) replayed as fast as they complete by ` +
    `${r.workers} worker processes against a real server, ${r.model} model, ${r.chunk_size}-token chunks: ` +
    `**${r.requests_per_second.toFixed(1)} requests/s** (${r.duration_seconds.toFixed(1)} s). Hit ratio ${(100 * r.hit_ratio).toFixed(2)} % ` +
    `(a perfect LRU of the same capacity: ${(100 * r.perfect_lru_hit_ratio).toFixed(2)} %); ${r.gb_stored} GB stored, ${r.gb_retrieved} GB retrieved; ` +
    `leaked contexts ${r.leaked_contexts}, open mappings after shutdown ${r.open_mappings_after_shutdown}, data mismatches ${r.data_mismatches}.`,
    "",
    "Where a request's time goes (ms; share = stage mean ÷ request mean; *compute* is the replay worker's stand-in",
    "for the engine's forward pass over the tokens it had to compute, so the rest is mpcache's):",
    "",
    "| stage | mean | share | p50 | p99 |",
    "|---|---:|---:|---:|---:|",
    row("LOOKUP (scheduler adapter)", l.lookup),
    row("RETRIEVE", l.retrieve),
    row("compute", l.compute),
    row("STORE", l.store),
    row("request", l.request),
    "",
    "Reproduce: `npm run replay` (300 requests) or the command above.",
    ""
  ].join("\n")
}

const main = async (): Promise<number> => {
  const argv = ["src/cli/main.ts", "replay", "--requests", String(REPLAY_REQUESTS), "--max-rate", "--model", "small", "--json"]
  const { code, stdout } = await runNode(argv, true)
  let r: ReplayJson
  try {
    r = JSON.parse(stdout) as ReplayJson
  } catch {
    process.stderr.write(`replay exited ${code} without a JSON summary; stdout:\n${stdout.slice(-2000)}\n`)
    return 1
  }
  const clean = r.leaked_contexts === 0 && r.open_mappings_after_shutdown === 0 && r.data_mismatches === 0 && r.failed_requests === 0
  const l = r.latency_ms
  const verdict = finishBench(args, { heading: HEADING, body: section(r, argv), rows: [{
    bench: "replay",
    figure: `replay, conversation trace, small model, --max-rate (${r.requests} requests)`,
    measured: `${r.requests_per_second.toFixed(1)} req/s`,
    reference: `mean ms: lookup ${l.lookup.mean.toFixed(1)}, retrieve ${l.retrieve.mean.toFixed(1)}, compute ${l.compute.mean.toFixed(1)}, ` +
      `store ${l.store.mean.toFixed(1)} of ${l.request.mean.toFixed(1)}`,
    ratio: null,
    target: "report; 0 failed, leaked, open, mismatched",
    met: clean
  }] })
  return code === 0 ? verdict : 1
}

process.exitCode = await main()
