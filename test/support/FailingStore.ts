/**
 * A STORE row that fails the way a module's handler can: with a wire error
 * (`invalid_argument`), or by dying (`internal: … boom`) when the key's
 * model is "die". Shared by the MQ server's own test and the assembly's.
 */
import { Effect } from "effect"
import { Store } from "../../src/schema/Op.ts"
import { InvalidArgument } from "../../src/schema/WireError.ts"
import { row } from "../../src/services/server/Handler.ts"

/** The failing STORE row. */
export const failingStoreRow = row(Store, "AFFINITY", ([key]) =>
  key.model_name === "die"
    ? Effect.die(new Error("boom"))
    : Effect.fail(new InvalidArgument({ message: `store: model ${key.model_name} has no registered layout` })))

/** A CacheKey of four tokens for `model` (request "r1", no salt). */
export const storeKey = (model: string) => ({
  model_name: model,
  world_size: 1,
  worker_id: 0,
  token_ids: [1, 2, 3, 4],
  start: 0,
  end: 4,
  request_id: "r1",
  cache_salt: ""
})
