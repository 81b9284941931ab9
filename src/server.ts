/**
 * `mpcache/server`: the server assembly for programs that embed an mpcache
 * server instead of running `mpcache serve` — `ServerLive(config)` (MQ
 * server, every built-in module, HTTP frontend), the configuration service
 * with its defaults and validation, `PluginModules` for out-of-tree modules,
 * and the Handler `row` and types such a module declares its ops with.
 *
 *   const result = validate({ ...defaults, port: 6000 })
 *   if ("config" in result) Effect.runFork(launchLogged(ServerLive(result.config)).pipe(Effect.provide(loggerLayer("pretty"))))
 *
 * (examples/embed.mjs runs, pings and stops one; README "Embed a server").
 *
 * Like `src/client.ts` this entry sits at the top of `src`, beside `cli`
 * (which assembles the same layers for `mpcache serve`): it re-exports from
 * layers and services and adds nothing of its own.
 */
export { PluginModules, ServerLive } from "./layers/Server.ts"
export { launchLogged } from "./layers/LaunchLogged.ts"
export { loggerLayer } from "./layers/Logging.ts"
export * from "./services/server/ServerConfig.ts"
export {
  DuplicateOp,
  type HandlerRow,
  type Pool,
  type RequestContext,
  row,
  type ServerModule
} from "./services/server/Handler.ts"
export { PROTOCOL_VERSION, VERSION } from "./version.ts"
