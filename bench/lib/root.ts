/** The repository root: the benches' working folder and where the report lives. */
import path from "node:path"

export const ROOT = path.resolve(import.meta.dirname, "..", "..")
