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
  /**
   * Whether `allocate(length)` would succeed once `released` (extents now in
   * use, not overlapping) were released too. Changes nothing: L1 asks it
   * before evicting, so a placement that cannot fit evicts nothing.
   */
  readonly wouldFit: (length: number, released: ReadonlyArray<{ readonly offset: number; readonly length: number }>) => boolean
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

  /** Whether some run of touching extents (sorted by offset) holds `length` bytes at its alignment. */
  const fitsIn = (extents: ReadonlyArray<Extent>, length: number): boolean => {
    const align = alignmentOf(length)
    let runStart = -1
    let runEnd = -1
    for (const e of extents) {
      if (e.offset === runEnd) runEnd += e.length
      else {
        runStart = e.offset
        runEnd = e.offset + e.length
      }
      if (runEnd - Math.ceil(runStart / align) * align >= length) return true
    }
    return false
  }

  const wouldFit = (length: number, released: ReadonlyArray<{ readonly offset: number; readonly length: number }>): boolean => {
    if (length <= 0) return false
    const all: Array<Extent> = free.map((e) => ({ offset: e.offset, length: e.length }))
    for (const r of released) all.push({ offset: r.offset, length: r.length })
    all.sort((a, b) => a.offset - b.offset)
    return fitsIn(all, length)
  }

  return {
    allocate,
    release,
    wouldFit,
    freeBytes: () => freeTotal,
    largestFree: () => free.reduce((m, e) => Math.max(m, e.length), 0)
  }
}
