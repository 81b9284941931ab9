/**
 * The test suite's child scripts (test/support/*-worker*.ts, …), started
 * from their bundled entries (build/test-bin/<name>.mjs, built by vitest's
 * global setup: test/support/bundleServe.ts) instead of from source: a child
 * then starts in about 0.2 s instead of the 1.3 s of type-stripping and
 * resolving effect's modules (issue 26 item 1). The bundle is rebuilt when a
 * file under src/ or test/support/ is newer, so a child runs what its source
 * says.
 */
import path from "node:path"
import { fileURLToPath } from "node:url"

/** The child scripts, by the name of their source file in test/support (without `.ts`). */
export const CHILD_SCRIPTS = [
  "worker-main",
  "worker-daemon",
  "empty-frame-worker",
  "engine-driven-worker-main",
  "shrink-worker",
  "cuda-fault-worker",
  "routing-id-collision",
  "cuda-probe",
  "tenant-l1-worker"
] as const

export type ChildScript = (typeof CHILD_SCRIPTS)[number]

/** Where the bundled child scripts are built (an ignored folder). */
export const TEST_BIN = fileURLToPath(new URL("../../build/test-bin", import.meta.url))

/** The file to run (`node <file> '<json args>'`) for the child script `name`: its bundled launcher. */
export const childScript = (name: ChildScript): string => path.join(TEST_BIN, `${name}.mjs`)
