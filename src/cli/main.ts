#!/usr/bin/env node
/**
 * The `mpcache` command (DESIGN §7). Only assembles and runs: the commands
 * live in ./commands, exit statuses in ./exitCodes.ts.
 */
import { NodeRuntime, NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import { Command } from "effect/cli"
import { VERSION } from "../version.ts"
import { clear, endSession, getChunkSize, noop, ping, status } from "./commands/client.ts"
import { keygen } from "./commands/keygen.ts"
import { replay } from "./commands/replay.ts"
import { serve } from "./commands/serve.ts"
import { ZmqSocketsLive } from "../layers/Zmq.ts"
import { teardown } from "./exitCodes.ts"
import { PresenterLive } from "./Presenter.ts"

const mpcache = Command.make("mpcache").pipe(
  Command.withDescription("Node-local KV-cache server for LLM inference engines"),
  Command.withSubcommands([serve, ping, noop, getChunkSize, clear, endSession, status, replay, keygen])
)

Command.run(mpcache, { version: VERSION }).pipe(
  Effect.provide([NodeServices.layer, ZmqSocketsLive, PresenterLive]),
  NodeRuntime.runMain({ teardown })
)
