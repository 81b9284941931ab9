/**
 * The authorized-keys file of `--curve-authorized-keys` (docs/security.md):
 * which CURVE public keys may talk to the server, and the tenant each
 * speaks for. One client key per line:
 *
 *     # comment (a line whose first non-blank character is #)
 *     <z85 public key> <tenant> [admin] [salt-group=<group>] [l1-share=<weight>]
 *
 * - the key: 40 characters of Z85 (what `mpcache keygen` writes to NAME.pub);
 * - the tenant: 1–64 of `A-Z a-z 0-9 _ . -`, starting with a letter or digit;
 *   several keys may name one tenant (its workers and its scheduler);
 * - `admin`: the tenant may CLEAR the whole cache;
 * - `salt-group=<group>`: tenants naming the same group share cached chunks
 *   (the server derives `cache_salt` from the group; default: the tenant's
 *   own name, so nobody else ever hits its chunks);
 * - `l1-share=<weight>`: the tenant's weight in L1 (a positive number; default
 *   `--tenant-l1-share-default`): its salt group's share is the sum of its
 *   tenants' weights over the groups' that hold L1 (issue 27 item 2,
 *   src/services/server/internal/L1Shares.ts).
 *
 * Blank lines are ignored. Every line of one tenant must carry the same
 * flags. A malformed line, a repeated key or flags that disagree fail the
 * whole file, naming the file and the line.
 */
import { readFileSync } from "node:fs"
import { Schema } from "effect"
import { isZ85Key } from "./Curve.ts"

/** What a listed key speaks for. */
export interface TenantGrant {
  readonly tenant: string
  /** May CLEAR. */
  readonly admin: boolean
  /** The cache namespace: tenants of one group share chunks. */
  readonly saltGroup: string
  /** Its weight in L1 (`l1-share=W`); absent: the server's `--tenant-l1-share-default`. */
  readonly l1Share?: number
}

/** The parsed file: Z85 public key → grant. */
export interface AuthorizedKeys {
  readonly path: string
  readonly keys: ReadonlyMap<string, TenantGrant>
}

/** The file cannot be read, or line `line` (1-based; 0: the whole file) is malformed. */
export class AuthorizedKeysInvalid extends Schema.TaggedError<AuthorizedKeysInvalid>()("AuthorizedKeysInvalid", {
  path: Schema.String,
  line: Schema.Number,
  reason: Schema.String
}) {
  override get message(): string {
    return this.line === 0 ? `${this.path}: ${this.reason}` : `${this.path}:${this.line}: ${this.reason}`
  }
}

const NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/
/** The largest `l1-share` weight (a bound on what one line can claim; weights are relative). */
export const MAX_L1_SHARE = 1_000_000

/** Parses the text of an authorized-keys file read from `path`. */
export const parseAuthorizedKeys = (path: string, text: string): AuthorizedKeys | AuthorizedKeysInvalid => {
  const keys = new Map<string, TenantGrant>()
  const firstLineOf = new Map<string, { readonly line: number; readonly grant: TenantGrant }>()
  const keyLine = new Map<string, number>()
  const lines = text.split(/\r?\n/)
  for (let i = 0; i < lines.length; i++) {
    const line = i + 1
    const content = lines[i]!.trim()
    if (content === "" || content.startsWith("#")) continue
    const bad = (reason: string) => new AuthorizedKeysInvalid({ path, line, reason })
    const [key, tenant, ...flags] = content.split(/\s+/)
    if (!isZ85Key(key!)) return bad(`"${key}" is not a 40-character Z85 public key (expected: <z85 public key> <tenant> [admin] [salt-group=NAME] [l1-share=WEIGHT])`)
    if (tenant === undefined) return bad("a key needs a tenant name after it (expected: <z85 public key> <tenant> [admin] [salt-group=NAME] [l1-share=WEIGHT])")
    if (!NAME.test(tenant)) return bad(`tenant "${tenant}" must be 1-64 of A-Z a-z 0-9 _ . - starting with a letter or digit`)
    let admin = false
    let saltGroup = tenant
    let l1Share: number | undefined
    for (const flag of flags) {
      if (flag === "admin") admin = true
      else if (flag.startsWith("salt-group=")) {
        const group = flag.slice("salt-group=".length)
        if (!NAME.test(group)) return bad(`salt group "${group}" must be 1-64 of A-Z a-z 0-9 _ . - starting with a letter or digit`)
        saltGroup = group
      } else if (flag.startsWith("l1-share=")) {
        const text = flag.slice("l1-share=".length)
        const weight = Number(text)
        if (text === "" || !Number.isFinite(weight) || weight <= 0 || weight > MAX_L1_SHARE) {
          return bad(`l1-share "${text}" must be a number above 0 and at most ${MAX_L1_SHARE} (a weight: shares are relative)`)
        }
        l1Share = weight
      } else return bad(`unknown flag "${flag}" (flags: admin, salt-group=NAME, l1-share=WEIGHT)`)
    }
    const again = keyLine.get(key!)
    if (again !== undefined) return bad(`this key is listed twice (first on line ${again}; a key speaks for one tenant)`)
    const grant: TenantGrant = { tenant, admin, saltGroup, ...(l1Share === undefined ? {} : { l1Share }) }
    const first = firstLineOf.get(tenant)
    if (first === undefined) firstLineOf.set(tenant, { line, grant })
    else if (first.grant.admin !== admin || first.grant.saltGroup !== saltGroup || first.grant.l1Share !== l1Share) {
      return bad(`tenant "${tenant}" has other flags on line ${first.line}; every key of a tenant carries the same flags`)
    }
    keys.set(key!, grant)
    keyLine.set(key!, line)
  }
  return { path, keys }
}

/** Reads and parses `path`; fails with `AuthorizedKeysInvalid`. */
export const readAuthorizedKeys = (path: string): AuthorizedKeys | AuthorizedKeysInvalid => {
  let text: string
  try {
    text = readFileSync(path, "utf8")
  } catch (e) {
    return new AuthorizedKeysInvalid({ path, line: 0, reason: `cannot read: ${e instanceof Error ? e.message : String(e)}` })
  }
  return parseAuthorizedKeys(path, text)
}
