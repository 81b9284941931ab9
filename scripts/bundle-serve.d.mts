/** Types of scripts/bundle-serve.mjs (a plain script, so that it runs before anything is built). */
export declare const ROOT: string
export declare const OUT_DIR: string
export declare const BUNDLE: string
export declare const LAUNCHER: string
/** One launcher: `node <file>` runs the entry `target` with `prepend` put before its own arguments. */
export interface Launcher {
  readonly target: string
  readonly prepend: ReadonlyArray<string>
}
/**
 * Builds `entries` (name → source file relative to the root) into `outDir` as `<name>.mjs`, with the
 * `launchers` (file name → launcher) beside them, when a file under `sourceDirs` is newer (or `force`).
 */
export declare const bundleEntries: (options: {
  readonly entries: Readonly<Record<string, string>>
  readonly launchers: Readonly<Record<string, Launcher>>
  readonly outDir: string
  readonly sourceDirs: ReadonlyArray<string>
  readonly force?: boolean
}) => Promise<string>
/** Builds the `mpcache` command's bundle and its launchers when stale (or `force`); resolves with what it did. */
export declare const bundleServe: (force?: boolean) => Promise<string>
