/**
 * A time bound for a bench's own awaits (a step, a start): `withDeadline`
 * rejects, naming `what`, when `p` has not settled within `ms`, and clears
 * its timer either way, so that a long bound never keeps the process alive
 * after the bench is done.
 */
export const withDeadline = <A>(p: Promise<A>, ms: number, what: string): Promise<A> => {
  let timer: NodeJS.Timeout | undefined
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not finish within ${(ms / 1000).toFixed(0)} s`)), ms)
  })
  return Promise.race([p, late]).finally(() => clearTimeout(timer))
}
