/**
 * The FIFOs of the hot paths (the outboxes, the per-peer queues) are arrays with a head index: taking is
 * `items[head++]`, no `shift()` (which copies the array each time). This keeps such an array from growing
 * without bound: once the taken prefix is everything, or past `minSlack` and more than half, it is cut off.
 */

/** After `items[head - 1]` was taken: the new head, `items` compacted in place when its taken prefix is long. */
export const compactAfterTake = (items: Array<unknown>, head: number, minSlack: number): number => {
  if (head === items.length) {
    items.length = 0
    return 0
  }
  if (head > minSlack && head * 2 > items.length) {
    items.splice(0, head)
    return 0
  }
  return head
}
