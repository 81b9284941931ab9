/**
 * First-fit allocation of byte extents inside one fixed region (the L1
 * pool), with free neighbours merged on release. Sizes that are multiples of
 * 64 are placed on 64-byte boundaries (every chunk object is), others
 * anywhere. Plain synchronous code: each call is atomic on the JS thread.
 */

/** A free extent [offset, offset + length). */
interface Extent {
  offset: number
  length: number
}

export interface ExtentAllocator {
  /** An offset for `length` bytes, or undefined when no free extent fits. */
  readonly allocate: (length: number) => number | undefined
  /** Returns [offset, offset + length) to the free list. */
  readonly release: (offset: number, length: number) => void
  /** Free bytes in total (maybe fragmented). */
  readonly freeBytes: () => number
  /** The largest single free extent. */
  readonly largestFree: () => number
}

const alignmentOf = (length: number): number => (length % 64 === 0 ? 64 : 1)

export const makeExtentAllocator = (capacityBytes: number): ExtentAllocator => {
  // Sorted by offset, never overlapping or touching (touching extents are merged).
  const free: Array<Extent> = capacityBytes > 0 ? [{ offset: 0, length: capacityBytes }] : []
  let freeTotal = capacityBytes

  const allocate = (length: number): number | undefined => {
    if (length <= 0) return undefined
    const align = alignmentOf(length)
    for (let i = 0; i < free.length; i++) {
      const e = free[i]!
      const start = Math.ceil(e.offset / align) * align
      const pad = start - e.offset
      if (e.length < pad + length) continue
      const tail = e.length - pad - length
      const replacement: Array<Extent> = []
      if (pad > 0) replacement.push({ offset: e.offset, length: pad })
      if (tail > 0) replacement.push({ offset: start + length, length: tail })
      free.splice(i, 1, ...replacement)
      freeTotal -= length
      return start
    }
    return undefined
  }

  const release = (offset: number, length: number): void => {
    let lo = 0
    let hi = free.length
    while (lo < hi) {
      const mid = (lo + hi) >>> 1
      if (free[mid]!.offset < offset) lo = mid + 1
      else hi = mid
    }
    free.splice(lo, 0, { offset, length })
    freeTotal += length
    // Merge with the next, then with the previous.
    const cur = free[lo]!
    const next = free[lo + 1]
    if (next !== undefined && cur.offset + cur.length === next.offset) {
      cur.length += next.length
      free.splice(lo + 1, 1)
    }
    const prev = free[lo - 1]
    if (prev !== undefined && prev.offset + prev.length === cur.offset) {
      prev.length += cur.length
      free.splice(lo, 1)
    }
  }

  return {
    allocate,
    release,
    freeBytes: () => freeTotal,
    largestFree: () => free.reduce((m, e) => Math.max(m, e.length), 0)
  }
}
