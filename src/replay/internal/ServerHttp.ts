/**
 * The replay's reads of a server's HTTP frontend: JSON, the decoded
 * `/api/status` and plain text (`/metrics`); each failure a ReplayError
 * naming the URL. `token`: the frontend's bearer token (the replay's own
 * CURVE servers have one: the L1 listing needs it, docs/security.md).
 *
 * @internal
 */
import { Effect } from "effect"
import { decodeStatusDocument } from "../../schema/Status.ts"
import { ReplayError } from "../ReplayOptions.ts"

/** A GET with the frontend's bearer token when it has one; a non-2xx answer fails with its status and body. */
const get = <A>(url: string, token: string | undefined, read: (r: Response) => Promise<A>) =>
  Effect.tryPromise({
    try: async () => {
      const r = await fetch(url, token === undefined ? {} : { headers: { authorization: `Bearer ${token}` } })
      if (!r.ok) throw new Error(`answered ${r.status}: ${(await r.text()).slice(0, 300)}`)
      return await read(r)
    },
    catch: (e) => new ReplayError({ message: `GET ${url} failed: ${e instanceof Error ? e.message : String(e)}` })
  })

export const getJson = (url: string, token?: string) => get(url, token, (r) => r.json() as Promise<Record<string, unknown>>)
/** `/api/status`, decoded (a server of another version fails with the field that does not fit). */
export const getStatus = (httpUrl: string, token?: string) =>
  getJson(`${httpUrl}/api/status`, token).pipe(
    Effect.flatMap((doc) =>
      Effect.mapError(decodeStatusDocument(doc), (e) => new ReplayError({ message: `${httpUrl}/api/status: ${e.message}` }))
    )
  )
export const getText = (url: string, token?: string) => get(url, token, (r) => r.text())
