/** The live native backend, recording every mapping of worker memory the server side opens. */
import { Effect, Layer } from "effect"
import { NativeMemoryLive } from "../../src/layers/NativeMemory.ts"
import { NativeMemory, type ShmMapping } from "../../src/native/Native.ts"

/** NativeMemoryLive that pushes each mapped handle to `opened` (the server's own L1 pool excepted). */
export const nativeProbe = (opened: Array<ShmMapping>) =>
  Layer.effect(
    NativeMemory,
    Effect.gen(function*() {
      const live = yield* NativeMemory
      return {
        ...live,
        map: (name: string, nbytes: number, options?: { readonly owned?: boolean }) =>
          Effect.tap(live.map(name, nbytes, options), (m) =>
            Effect.sync(() => {
              if (!name.startsWith("mpcache-l1-")) opened.push(m)
            }))
      }
    })
  ).pipe(Layer.provide(NativeMemoryLive))
