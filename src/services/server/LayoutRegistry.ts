/**
 * Registered KV layouts per (model name, world size), reference-counted
 * across the instances that registered them (upstream
 * `layout_desc_registry`, refcount since #3448: unregistering one TP rank
 * must not remove the layout its peers still use). LOOKUP answers 0 hits for
 * a model with no registered layout (upstream: "No GPU context found for
 * model … during lookup").
 */
import { Context, Effect, Layer, Ref } from "effect"

/** The L1 object layout of one model: `[2, numLayers, chunkSizeTokens, hiddenDim]` of `elementBytes`. */
export interface KvLayout {
  readonly numLayers: number
  /** num_heads × head_size. */
  readonly hiddenDim: number
  readonly elementBytes: number
  /** The element type's name (`bfloat16`, …): part of the L2 layout fingerprint (issue 15). */
  readonly dtype: string
  /** Bytes of one L1 object (one chunk of one rank). */
  readonly chunkBytes: number
}

const keyOf = (modelName: string, worldSize: number) => `${worldSize}:${modelName}`

export class LayoutRegistry extends Context.Service<LayoutRegistry, {
  /** Adds a reference to (model, world size) → layout. */
  readonly register: (modelName: string, worldSize: number, layout: KvLayout) => Effect.Effect<void>
  /** Drops a reference; the layout goes with the last one. */
  readonly unregister: (modelName: string, worldSize: number) => Effect.Effect<void>
  readonly get: (modelName: string, worldSize: number) => Effect.Effect<KvLayout | undefined>
}>()("mpcache/services/LayoutRegistry") {
  static readonly layer = Layer.effect(
    this,
    Effect.gen(function*() {
      const ref = yield* Ref.make(new Map<string, { readonly layout: KvLayout; readonly refs: number }>())
      return {
        register: (modelName, worldSize, layout) =>
          Ref.update(ref, (m) => {
            const next = new Map(m)
            const k = keyOf(modelName, worldSize)
            next.set(k, { layout, refs: (m.get(k)?.refs ?? 0) + 1 })
            return next
          }),
        unregister: (modelName, worldSize) =>
          Ref.update(ref, (m) => {
            const k = keyOf(modelName, worldSize)
            const e = m.get(k)
            if (e === undefined) return m
            const next = new Map(m)
            if (e.refs <= 1) next.delete(k)
            else next.set(k, { layout: e.layout, refs: e.refs - 1 })
            return next
          }),
        get: (modelName, worldSize) => Effect.map(Ref.get(ref), (m) => m.get(keyOf(modelName, worldSize))?.layout)
      }
    })
  )
  /** For tests: the real registry (it needs nothing; in memory). */
  static readonly layerTest = this.layer
}
