/**
 * The replay's reads of a server's HTTP frontend: JSON, the decoded
 * `/api/status` and plain text (`/metrics`); each failure a ReplayError
 * naming the URL.
 *
 * @internal
 */
import { Effect } from "effect"
import { decodeStatusDocument } from "../../schema/Status.ts"
import { ReplayError } from "../ReplayOptions.ts"

export const getJson = (url: string) =>
  Effect.tryPromise({
    try: () => fetch(url).then((r) => r.json() as Promise<Record<string, unknown>>),
    catch: (e) => new ReplayError({ message: `GET ${url} failed: ${e instanceof Error ? e.message : String(e)}` })
  })
/** `/api/status`, decoded (a server of another version fails with the field that does not fit). */
export const getStatus = (httpUrl: string) =>
  getJson(`${httpUrl}/api/status`).pipe(
    Effect.flatMap((doc) =>
      Effect.mapError(decodeStatusDocument(doc), (e) => new ReplayError({ message: `${httpUrl}/api/status: ${e.message}` }))
    )
  )
export const getText = (url: string) =>
  Effect.tryPromise({
    try: () => fetch(url).then((r) => r.text()),
    catch: (e) => new ReplayError({ message: `GET ${url} failed: ${e instanceof Error ? e.message : String(e)}` })
  })
