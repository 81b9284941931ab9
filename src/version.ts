/** mpcache's version (kept equal to package.json's by a test). */
export const VERSION = "0.1.0"

/** The wire protocol version this build speaks (DESIGN §3). */
export const PROTOCOL_VERSION = 1
