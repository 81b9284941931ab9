/**
 * A binary min-heap of `(key, item)` nodes, keys in Clock millis. Plain
 * mutable state, not transactional: the InstanceRegistry keeps one as an
 * index of lower bounds next to its TxHashMap (see StaleIndex.ts). Keys and
 * items live in two parallel arrays, so a node costs no object of its own.
 */

/** A min-heap of `(keyMs, item)`; ties in any order. */
export interface DeadlineHeap<T> {
  /** Number of nodes. */
  readonly size: () => number
  /** Adds a node. O(log n). */
  readonly push: (keyMs: number, item: T) => void
  /** Smallest key, `Infinity` when empty. O(1). */
  readonly peekKey: () => number
  /** The item of the node with the smallest key; only when `size() > 0`. */
  readonly peek: () => T
  /** Removes the node with the smallest key (no-op when empty). O(log n). */
  readonly pop: () => void
  /** Gives the node with the smallest key a new key: one sift instead of a pop and a push. O(log n). */
  readonly rekeyTop: (keyMs: number) => void
  /** Keeps only the nodes `keep` accepts, then restores the heap order. O(n). */
  readonly retain: (keep: (keyMs: number, item: T) => boolean) => void
  /** Removes every node. */
  readonly clear: () => void
}

/** An empty heap. */
export const makeDeadlineHeap = <T>(): DeadlineHeap<T> => {
  let keys: Array<number> = []
  let items: Array<T> = []

  const siftUp = (start: number): void => {
    const key = keys[start]!
    const item = items[start]!
    let i = start
    while (i > 0) {
      const parent = (i - 1) >> 1
      if (keys[parent]! <= key) break
      keys[i] = keys[parent]!
      items[i] = items[parent]!
      i = parent
    }
    keys[i] = key
    items[i] = item
  }

  const siftDown = (start: number): void => {
    const n = keys.length
    const key = keys[start]!
    const item = items[start]!
    let i = start
    while (true) {
      const left = 2 * i + 1
      if (left >= n) break
      const right = left + 1
      const child = right < n && keys[right]! < keys[left]! ? right : left
      if (key <= keys[child]!) break
      keys[i] = keys[child]!
      items[i] = items[child]!
      i = child
    }
    keys[i] = key
    items[i] = item
  }

  return {
    size: () => keys.length,
    push: (keyMs, item) => {
      keys.push(keyMs)
      items.push(item)
      siftUp(keys.length - 1)
    },
    peekKey: () => (keys.length === 0 ? Infinity : keys[0]!),
    peek: () => items[0]!,
    pop: () => {
      if (keys.length === 0) return
      const lastKey = keys.pop()!
      const lastItem = items.pop()!
      if (keys.length === 0) return
      keys[0] = lastKey
      items[0] = lastItem
      siftDown(0)
    },
    rekeyTop: (keyMs) => {
      if (keys.length === 0) return
      keys[0] = keyMs
      siftDown(0)
    },
    retain: (keep) => {
      const nextKeys: Array<number> = []
      const nextItems: Array<T> = []
      for (let i = 0; i < keys.length; i++) {
        if (keep(keys[i]!, items[i]!)) {
          nextKeys.push(keys[i]!)
          nextItems.push(items[i]!)
        }
      }
      keys = nextKeys
      items = nextItems
      // Floyd's heapify: O(n).
      for (let i = (keys.length >> 1) - 1; i >= 0; i--) siftDown(i)
    },
    clear: () => {
      keys = []
      items = []
    }
  }
}
