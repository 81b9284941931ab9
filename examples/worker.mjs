#!/usr/bin/env node
// @ts-check
/**
 * An inference worker in miniature, written against the public entry points
 * only: it creates a paged KV cache in sealed memfds, registers it through
 * the WorkerAdapter (which hands the descriptors to the server: docs/memfd.md), writes two chunks of KV bytes and STOREs them, LOOKUPs
 * the same tokens through the SchedulerAdapter, RETRIEVEs them into other
 * blocks of its cache and checks every byte.
 *
 *   node worker.mjs [endpoint]      (default tcp://127.0.0.1:5555)
 *
 * stdout with a server started with `--chunk-size 64` (exit 0):
 *   chunk size: 64 tokens
 *   registered a paged KV cache: 2 layers, 16 blocks of 16 tokens, bfloat16
 *   stored 128 tokens from blocks 0-7: true
 *   lookup: 128 of 128 tokens hit
 *   retrieved 128 tokens into blocks 8-15: true
 *   verified 32768 bytes: all equal
 * On failure it prints the error on stderr and exits 1. Closing the scope
 * UNREGISTERs the worker and closes its memfds.
 *
 * Plain JavaScript (ESM): see ping.mjs for why.
 */
import { Effect, Layer, Logger } from "effect"
import { ClientLive, makePagedKvCache, makeSchedulerAdapter, makeWorkerAdapter } from "mpcache/client"

const endpoint = process.argv[2] ?? "tcp://127.0.0.1:5555"
const modelName = "example-model"
const blockSizeTokens = 16

/** Deterministic bytes for one layer's K or V over `blocks` blocks: what is stored is what must come back. */
const kvBytes = (/** @type {number} */ layer, /** @type {0 | 1} */ kv, /** @type {number} */ bytes) => {
  const out = new Uint8Array(bytes)
  let x = (layer * 40503 + kv * 7919 + 1) >>> 0
  for (let i = 0; i < bytes; i++) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0
    out[i] = x >>> 24
  }
  return out
}

const program = Effect.gen(function*() {
  // Asks the server's chunk size at construction; closing the scope sends UNREGISTER.
  const worker = yield* makeWorkerAdapter({ endpoint, modelName, worldSize: 1, kvRank: 0 })
  const chunk = worker.chunkSizeTokens
  const tokens = 2 * chunk
  const blocks = tokens / blockSizeTokens
  const tokenIds = Array.from({ length: tokens }, (_, i) => (i * 31 + 7) % 32_000)

  // Blocks [0, blocks) are written and stored; [blocks, 2 blocks) receive the retrieve.
  const cache = yield* makePagedKvCache({
    namePrefix: `mpcache-example-${process.pid}`,
    numLayers: 2,
    numBlocks: 2 * blocks,
    blockSizeTokens,
    numHeads: 2,
    headSize: 16,
    dtype: "bfloat16"
  })
  yield* worker.registerPagedKvCache(cache)
  const g = cache.geometry
  const lines = [
    `chunk size: ${chunk} tokens`,
    `registered a paged KV cache: ${g.numLayers} layers, ${g.numBlocks} blocks of ${g.blockSizeTokens} tokens, ${g.dtype}`
  ]

  const layers = Array.from({ length: g.numLayers }, (_, l) => l)
  const kvs = /** @type {const} */ ([0, 1])
  const span = blocks * g.blockBytes
  for (const layer of layers) {
    for (const kv of kvs) yield* cache.writeBlocks(layer, kv, 0, kvBytes(layer, kv, span))
  }
  const stored = yield* worker.store({
    requestId: "example-store",
    tokenIds,
    start: 0,
    end: tokens,
    blockIds: Array.from({ length: blocks }, (_, i) => i)
  })
  lines.push(`stored ${tokens} tokens from blocks 0-${blocks - 1}: ${stored}`)

  // The scheduler's view: how much of this prefix the server holds (the hit chunks stay locked until endSession).
  const scheduler = yield* makeSchedulerAdapter({ endpoint, modelName, worldSize: 1 })
  const hit = yield* scheduler.lookup("example-retrieve", tokenIds)
  lines.push(`lookup: ${hit} of ${tokens} tokens hit`)
  const retrieved = yield* worker.retrieve({
    requestId: "example-retrieve",
    tokenIds,
    start: 0,
    end: hit,
    blockIds: Array.from({ length: hit / blockSizeTokens }, (_, i) => blocks + i)
  })
  yield* scheduler.endSession("example-retrieve")
  lines.push(`retrieved ${hit} tokens into blocks ${blocks}-${2 * blocks - 1}: ${retrieved}`)

  let compared = 0
  let differing = 0
  for (const layer of layers) {
    for (const kv of kvs) {
      const want = kvBytes(layer, kv, span)
      const got = yield* cache.readBlocks(layer, kv, blocks, blocks)
      for (let i = 0; i < span; i++) if (got[i] !== want[i]) differing++
      compared += span
    }
  }
  lines.push(`verified ${compared} bytes: ${differing === 0 ? "all equal" : `${differing} differ`}`)
  if (differing !== 0 || !stored || !retrieved) process.exitCode = 1
  return lines
})

// Sockets and native memory; logs (the instance id, heartbeat events) go to stderr.
const live = Layer.mergeAll(ClientLive, Layer.succeed(Logger.LogToStderr, true))

Effect.runPromise(program.pipe(Effect.scoped, Effect.provide(live))).then(
  (lines) => process.stdout.write(`${lines.join("\n")}\n`),
  (error) => {
    process.stderr.write(`worker failed: ${String(error)}\n`)
    process.exitCode = 1
  }
)
