/**
 * Preloaded into the mpcache server by bench:soak and bench:chaos (`node
 * --expose-gc --import ./bench/lib/heap-probe.ts src/cli/main.ts serve …`):
 * reads the server's heap without touching server code and without the
 * inspector. On SIGWINCH it runs a full GC (when `--expose-gc` is given) and
 * writes one line `{"bench_heap":{"heap_used","heap_total","external",
 * "array_buffers","rss","gc"}}` (bytes; `gc`: whether a GC ran first) to
 * stderr.
 *
 * SIGWINCH because SIGUSR2 is bench/transfer/loop-delay.ts's and SIGUSR1 starts
 * Node's inspector; a server without this preload ignores SIGWINCH (its
 * default action), so a stray probe never kills one. Only for benchmarks.
 */

process.on("SIGWINCH", () => {
  const collect = globalThis.gc
  // Two passes: the first may only queue finalizers whose objects the second frees.
  if (collect !== undefined) {
    collect()
    collect()
  }
  const m = process.memoryUsage()
  const line = {
    bench_heap: {
      heap_used: m.heapUsed,
      heap_total: m.heapTotal,
      external: m.external,
      array_buffers: m.arrayBuffers,
      rss: m.rss,
      gc: collect !== undefined
    }
  }
  process.stderr.write(`${JSON.stringify(line)}\n`)
})
