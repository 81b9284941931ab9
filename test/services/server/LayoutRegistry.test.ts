/**
 * The layout registry on its own (LayoutRegistry.ts; upstream
 * `layout_desc_registry`, refcount since #3448): one layout per (model,
 * world size), kept while any instance that registered it is left.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { type KvLayout, LayoutRegistry } from "../../../src/services/server/LayoutRegistry.ts"

const layout = (numLayers: number): KvLayout => ({ numLayers, hiddenDim: 128, elementBytes: 2, dtype: "bfloat16", chunkBytes: 2 * numLayers * 256 * 128 * 2 })

describe("LayoutRegistry", () => {
  it.effect("unregistering one TP rank keeps the layout its peer still uses; the last reference takes it", () =>
    Effect.gen(function*() {
      const r = yield* LayoutRegistry
      yield* r.register("m", 2, layout(4))
      yield* r.register("m", 2, layout(4))
      yield* r.unregister("m", 2)
      assert.deepStrictEqual(yield* r.get("m", 2), layout(4))
      yield* r.unregister("m", 2)
      assert.isUndefined(yield* r.get("m", 2))
      // One unregister too many changes nothing.
      yield* r.unregister("m", 2)
      assert.isUndefined(yield* r.get("m", 2))
    }).pipe(Effect.provide(LayoutRegistry.layerTest)))

  it.effect("the key is (model, world size): the same model at another world size is another layout", () =>
    Effect.gen(function*() {
      const r = yield* LayoutRegistry
      yield* r.register("m", 1, layout(2))
      yield* r.register("m", 2, layout(4))
      yield* r.register("other", 1, layout(8))
      assert.deepStrictEqual([yield* r.get("m", 1), yield* r.get("m", 2), yield* r.get("other", 1), yield* r.get("m", 4)], [
        layout(2),
        layout(4),
        layout(8),
        undefined
      ])
    }).pipe(Effect.provide(LayoutRegistry.layerTest)))

  it.effect("a later registration's layout replaces the one held, and adds a reference", () =>
    Effect.gen(function*() {
      const r = yield* LayoutRegistry
      yield* r.register("m", 1, layout(2))
      yield* r.register("m", 1, layout(3))
      assert.deepStrictEqual(yield* r.get("m", 1), layout(3))
      yield* r.unregister("m", 1)
      assert.deepStrictEqual(yield* r.get("m", 1), layout(3))
    }).pipe(Effect.provide(LayoutRegistry.layerTest)))
})
