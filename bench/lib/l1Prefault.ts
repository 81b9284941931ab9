/**
 * Waits for a server's background L1 prefault (issue 15/16 benches): until
 * its `/api/status` l1.prefaulted_bytes reaches capacity_bytes, so a measured
 * phase neither shares the machine with the prefault nor pays the first
 * touch of fresh pages (seconds per GiB under some hypervisors), as a
 * long-running server does not. Polls every `pollMs`; throws after
 * `timeoutMs`, naming the bytes done. Returns the seconds it waited.
 */
import { sleep } from "./time.ts"

export const awaitL1Prefault = async (httpUrl: string, timeoutMs: number, pollMs: number): Promise<number> => {
  const t0 = performance.now()
  for (;;) {
    const status = (await (await fetch(`${httpUrl}/api/status`)).json()) as {
      readonly l1: { readonly capacity_bytes: number; readonly prefaulted_bytes: number }
    }
    if (status.l1.prefaulted_bytes >= status.l1.capacity_bytes) return (performance.now() - t0) / 1000
    if (performance.now() - t0 > timeoutMs) {
      throw new Error(
        `L1 prefault of ${httpUrl} not done after ${timeoutMs / 1000} s (${status.l1.prefaulted_bytes} of ${status.l1.capacity_bytes} bytes)`
      )
    }
    await sleep(pollMs)
  }
}
