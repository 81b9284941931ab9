/** Types of scripts/bundle-serve.mjs (a plain script, so that it runs before anything is built). */
export declare const OUT_DIR: string
export declare const BUNDLE: string
export declare const LAUNCHER: string
/** Whether the bundle is missing or older than one of its sources. */
export declare const isStale: () => boolean
/** Builds the bundle and its launcher when stale (or `force`); resolves with what it did. */
export declare const bundleServe: (force?: boolean) => Promise<string>
