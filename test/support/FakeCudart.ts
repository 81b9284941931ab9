/**
 * The fake libcudart (test/support/fakecudart/fakecudart.c) for tests: built
 * here with the system C compiler into a fresh temp dir, selected with
 * MPCACHE_CUDART, and observed through its shared state file (counters and
 * per-allocation slots, see the C source), and made to fail on demand
 * ({@link setFakeFailure}: a refused handle, a device lost mid-copy, a
 * sticky error; issue 13 item 4).
 *
 * libcudart is loaded once per process, on the first CUDA call: a test file
 * that uses the fake in-process sets MPCACHE_CUDART before that (see
 * {@link useFakeCudartInProcess}); child processes inherit it.
 */
import { spawnSync } from "node:child_process"
import { closeSync, constants, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, statSync, writeSync } from "node:fs"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"

export const FAKE_CUDART_SOURCE = fileURLToPath(new URL("./fakecudart/fakecudart.c", import.meta.url))

/** The fake's devices, by ordinal. */
export const FAKE_DEVICES = ["GPU-facec0da-0000-4000-8000-000000000000", "GPU-facec0da-0000-4000-8000-000000000001"] as const

export interface FakeCudart {
  /** The temp dir holding the build and its state. */
  readonly dir: string
  /** The .so to put in MPCACHE_CUDART. */
  readonly library: string
  /** Its state file (counters shared by every process that loads this library). */
  readonly statePath: string
}

/**
 * Compiles the fake into a new temp dir (`cc -shared -fPIC`; $CC overrides), removed when this
 * process exits. Throws with the compiler's output on failure.
 */
export const buildFakeCudart = (): FakeCudart => {
  const dir = mkdtempSync(join(tmpdir(), "mpcache-fakecudart-"))
  const library = join(dir, "libfakecudart.so")
  process.once("exit", () => removeFakeCudart({ dir, library, statePath: `${library}.state` }))
  const cc = process.env["CC"] ?? "cc"
  const run = spawnSync(cc, ["-shared", "-fPIC", "-O2", "-Wall", "-o", library, FAKE_CUDART_SOURCE, "-lpthread", "-lrt"], {
    encoding: "utf8"
  })
  if (run.error !== undefined || run.status !== 0) {
    throw new Error(`building the fake libcudart with ${cc} failed: ${run.error?.message ?? ""}${run.stderr}`)
  }
  return { dir, library, statePath: `${library}.state` }
}

/**
 * Removes the fake's temp dir (a process that loaded it keeps its mapping of the library) and the "device
 * memory" segments of this fake left in /dev/shm: `fakecuda-<state inode>-*`, which the fake unlinks only once
 * nobody holds them, so an importer whose close failed (a sticky error) or that was killed leaves them behind.
 */
export const removeFakeCudart = (fake: FakeCudart): void => {
  let ino: number | undefined
  try {
    ino = statSync(fake.statePath).ino
  } catch {
    ino = undefined // no process loaded it: no segment either
  }
  if (ino !== undefined) {
    const prefix = `fakecuda-${ino}-`
    for (const name of readdirSync("/dev/shm")) if (name.startsWith(prefix)) rmSync(`/dev/shm/${name}`, { force: true })
  }
  rmSync(fake.dir, { recursive: true, force: true })
}

/** Builds the fake and points this process (and its children) at it. Call before the first CUDA call. */
export const useFakeCudartInProcess = (): FakeCudart => {
  const fake = buildFakeCudart()
  process.env["MPCACHE_CUDART"] = fake.library
  return fake
}

export interface FakeSlot {
  readonly slot: number
  readonly ownerPid: number
  readonly device: number
  readonly size: number
  readonly freed: boolean
  readonly importRefs: number
  readonly opens: number
  readonly closes: number
  readonly unlinked: boolean
}

export interface FakeCudartState {
  readonly ipcOpens: number
  readonly ipcCloses: number
  readonly mallocs: number
  readonly frees: number
  readonly streamsCreated: number
  readonly streamsDestroyed: number
  readonly memcpys: number
  readonly syncs: number
  readonly violations: number
  readonly peerOpens: number
  readonly copyDelayMs: number
  /** The armed failure (see {@link setFakeFailure}); point "none" once a once/sticky one fired. */
  readonly failure: Omit<FakeFailure, "point"> & { readonly point: FakeFailurePoint | "none" }
  /** Failures injected so far, all processes (a sticky process's repeats not counted). */
  readonly failures: number
  readonly slots: ReadonlyArray<FakeSlot>
}

const HEADER_FIELDS = 24
const SLOT_FIELDS = 8

/** Reads the state file (zeros when no process has loaded the fake yet). */
export const readFakeState = (fake: FakeCudart): FakeCudartState => {
  let bytes: Buffer
  try {
    bytes = readFileSync(fake.statePath)
  } catch {
    bytes = Buffer.alloc(HEADER_FIELDS * 8)
  }
  const at = (i: number) => (bytes.length >= (i + 1) * 8 ? Number(bytes.readBigInt64LE(i * 8)) : 0)
  const nextSlot = at(10)
  const slots: Array<FakeSlot> = []
  for (let s = 0; s < nextSlot; s++) {
    const base = HEADER_FIELDS + s * SLOT_FIELDS
    slots.push({
      slot: s,
      ownerPid: at(base),
      device: at(base + 1),
      size: at(base + 2),
      freed: at(base + 3) !== 0,
      importRefs: at(base + 4),
      opens: at(base + 5),
      closes: at(base + 6),
      unlinked: at(base + 7) !== 0
    })
  }
  return {
    ipcOpens: at(1),
    ipcCloses: at(2),
    mallocs: at(3),
    frees: at(4),
    streamsCreated: at(5),
    streamsDestroyed: at(6),
    memcpys: at(7),
    syncs: at(8),
    violations: at(9),
    peerOpens: at(11),
    copyDelayMs: at(12),
    failure: { point: FAILURE_POINTS[at(13)] ?? "none", error: at(14), mode: FAILURE_MODES[at(15)] ?? "once", skip: at(16) },
    failures: at(17),
    slots
  }
}

/** Writes int64 fields of the state file's header, at field index `first` onwards. */
const writeHeader = (fake: FakeCudart, first: number, values: ReadonlyArray<number>): void => {
  const fd = openSync(fake.statePath, constants.O_RDWR | constants.O_CREAT, 0o600)
  try {
    const b = Buffer.alloc(8 * values.length)
    values.forEach((v, i) => b.writeBigInt64LE(BigInt(v), i * 8))
    writeSync(fd, b, 0, b.length, first * 8)
  } finally {
    closeSync(fd)
  }
}

/**
 * Where an injected failure hits (fakecudart.c): "ipc_open" (cudaIpcOpenMemHandle refuses),
 * "memcpy" (cudaMemcpyAsync through IPC-imported memory refuses), "sync" (such a copy is lost and
 * the next cudaStreamSynchronize of its stream reports the error). Only the importing process is hit.
 */
export type FakeFailurePoint = "ipc_open" | "memcpy" | "sync"
const FAILURE_POINTS: ReadonlyArray<FakeFailurePoint | "none"> = ["none", "ipc_open", "memcpy", "sync"]

/** once: one failure; always: every matching call until cleared; sticky: one, then every call of that process fails. */
export type FakeFailureMode = "once" | "always" | "sticky"
const FAILURE_MODES: ReadonlyArray<FakeFailureMode> = ["once", "always", "sticky"]

export interface FakeFailure {
  readonly point: FakeFailurePoint
  /** The cudaError_t returned, e.g. 719 (cudaErrorLaunchFailure), 46 (cudaErrorDevicesUnavailable), 214 (ECC). */
  readonly error: number
  readonly mode?: FakeFailureMode
  /** Matching calls that pass before the first failure (default 0). */
  readonly skip?: number
}

/** Some cudaError_t values the fake names (cudaGetErrorName / cudaGetErrorString as CUDA 12's). */
export const CUDA_ERRORS = {
  cudaErrorInvalidValue: 1,
  cudaErrorDevicesUnavailable: 46,
  cudaErrorECCUncorrectable: 214,
  cudaErrorIllegalAddress: 700,
  cudaErrorLaunchFailure: 719
} as const

/**
 * Arms a failure in every process using this fake, from the next matching call on (the same as
 * FAKECUDART_FAIL="<point>:<error>:<mode>:<skip>" at load time). The skip and the mode are written
 * before the point, so no call sees a half-armed failure.
 */
export const setFakeFailure = (fake: FakeCudart, failure: FakeFailure): void => {
  writeHeader(fake, 14, [failure.error, FAILURE_MODES.indexOf(failure.mode ?? "once"), failure.skip ?? 0])
  writeHeader(fake, 13, [FAILURE_POINTS.indexOf(failure.point)])
}

/** Disarms the failure point (a sticky process stays broken: that is its process's state). */
export const clearFakeFailure = (fake: FakeCudart): void => writeHeader(fake, 13, [0])

/** The fake built at `library` (what MPCACHE_CUDART names), e.g. in a child process that inherited it. */
export const fakeCudartAt = (library: string): FakeCudart => ({
  dir: dirname(library),
  library,
  statePath: `${library}.state`
})

/** Makes every copy queued from now on sleep `ms` first (all processes using this fake). */
export const setFakeCopyDelay = (fake: FakeCudart, ms: number): void => writeHeader(fake, 12, [ms])

/** What the fake put in a 64-byte IPC handle. */
export interface FakeHandle {
  readonly magic: string
  readonly device: number
  readonly slot: number
  readonly size: number
  readonly segment: string
}

export const decodeFakeHandle = (handle: Uint8Array): FakeHandle => {
  const b = Buffer.from(handle.buffer, handle.byteOffset, handle.byteLength)
  const nameEnd = b.indexOf(0, 24)
  return {
    magic: b.toString("latin1", 0, 8),
    device: b.readUInt32LE(8),
    slot: b.readUInt32LE(12),
    size: Number(b.readBigUInt64LE(16)),
    segment: b.toString("latin1", 24, nameEnd < 0 ? 64 : nameEnd)
  }
}
