/**
 * deploy/kubernetes (issue 27 item 3): every manifest parses and validates
 * against the Kubernetes API's JSON schemas (kubernetes-models, whose models
 * carry the generated schemas of the API; a broken object is shown to fail
 * first, so a validator that accepts anything cannot pass); every `--flag` in
 * the DaemonSet's args and every ConfigMap key is a flag `mpcache serve
 * --help` lists; the DaemonSet holds what the issue asks (hostIPC, the fd
 * socket on a hostPath, probes on /livez and /readyz, Prometheus
 * annotations, a memory request sized from --l1-size-gb, the Secret's files);
 * and the args themselves, with the ConfigMap's values, paths moved to a
 * temporary folder and a small L1, start a real server whose /readyz is 200.
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { DaemonSet, type IDaemonSet } from "kubernetes-models/apps/v1/DaemonSet"
import { ConfigMap, type IConfigMap } from "kubernetes-models/v1/ConfigMap"
import { type INamespace, Namespace } from "kubernetes-models/v1/Namespace"
import { type ISecret, Secret } from "kubernetes-models/v1/Secret"
import { parseAllDocuments } from "yaml"
import { runCli, startCli } from "../support/Cli.ts"
import { eventually } from "../support/LiveFleet.ts"

const DIR = fileURLToPath(new URL("../../deploy/kubernetes", import.meta.url))

/** The schema check of each kind: the model's `validate()` throws naming the path and the rule. */
const VALIDATORS: Readonly<Record<string, (doc: unknown) => void>> = {
  "apps/v1 DaemonSet": (d) => new DaemonSet(d as IDaemonSet).validate(),
  "v1 ConfigMap": (d) => new ConfigMap(d as IConfigMap).validate(),
  "v1 Secret": (d) => new Secret(d as ISecret).validate(),
  "v1 Namespace": (d) => new Namespace(d as INamespace).validate()
}

interface Manifest {
  readonly file: string
  readonly doc: Record<string, unknown>
}

/** Every document of every .yaml file in deploy/kubernetes; a YAML error fails here. */
const manifests = (): ReadonlyArray<Manifest> =>
  readdirSync(DIR).filter((f) => f.endsWith(".yaml")).sort().flatMap((file) =>
    parseAllDocuments(readFileSync(join(DIR, file), "utf8")).map((d) => {
      assert.deepStrictEqual(d.errors.map((e) => e.message), [], file)
      return { file, doc: d.toJS() as Record<string, unknown> }
    })
  )

const kindOf = (doc: Record<string, unknown>) => `${String(doc["apiVersion"])} ${String(doc["kind"])}`
/** The one document of `kind`, as parsed (its model validates it: `daemonSet()` …). */
const one = (kind: string): unknown => {
  const found = manifests().filter((m) => kindOf(m.doc) === kind)
  assert.strictEqual(found.length, 1, kind)
  return found[0]!.doc
}

/** The model of `doc`, once its schema accepted it. */
const validated = <M extends { validate(): void }>(model: M): M => {
  model.validate()
  return model
}

const daemonSet = () => validated(new DaemonSet(one("apps/v1 DaemonSet") as IDaemonSet))
const configMap = () => validated(new ConfigMap(one("v1 ConfigMap") as IConfigMap))
const secret = () => validated(new Secret(one("v1 Secret") as ISecret))
const container = () => daemonSet().spec!.template.spec!.containers[0]!

/** ConfigMap key → flag: MPCACHE_L1_SIZE_GB → --l1-size-gb. */
const flagOfKey = (key: string) => `--${key.replace(/^MPCACHE_/, "").toLowerCase().replaceAll("_", "-")}`

/** The flags `mpcache serve --help` lists. */
const serveFlags = Effect.gen(function*() {
  const help = yield* runCli(["serve", "--help"], 30_000)
  assert.strictEqual(help.code, 0, help.stderr)
  const flags = new Set([...help.stdout.matchAll(/^\s+(--[a-z0-9-]+)/gm)].map((m) => m[1]!))
  // The scanner sees the flags: a help text it cannot read cannot pass.
  assert.isTrue(flags.has("--l1-size-gb") && flags.has("--fd-socket") && flags.size > 40, [...flags].join(" "))
  return flags
})

describe("deploy/kubernetes", () => {
  it("every manifest validates against its kind's schema; a broken DaemonSet is refused", () => {
    const all = manifests()
    assert.deepStrictEqual(all.map((m) => `${m.file}: ${kindOf(m.doc)}`), [
      "configmap.yaml: v1 ConfigMap",
      "daemonset.yaml: apps/v1 DaemonSet",
      "namespace.yaml: v1 Namespace",
      "secret.yaml: v1 Secret"
    ])
    for (const m of all) {
      const validate = VALIDATORS[kindOf(m.doc)]
      assert.isDefined(validate, `${m.file}: no schema for ${kindOf(m.doc)}`)
      validate!(m.doc)
    }
    const broken = structuredClone(one("apps/v1 DaemonSet")) as { spec: { template: { spec: { containers: Array<Record<string, unknown>> } } } }
    broken.spec.template.spec.containers[0]!["ports"] = [{ containerPort: "http" }]
    assert.throws(() => VALIDATORS["apps/v1 DaemonSet"]!(broken), /containerPort/)
  })

  it.live("every --flag of the DaemonSet's args and every ConfigMap key is a flag of `mpcache serve --help`", () =>
    Effect.gen(function*() {
      const flags = yield* serveFlags
      const args = container().args ?? []
      const used = args.filter((a) => a.startsWith("--")).map((a) => a.split("=")[0]!)
      assert.deepStrictEqual(used.filter((f) => !flags.has(f)), [], "DaemonSet args")
      const keys = Object.keys(configMap().data ?? {})
      assert.deepStrictEqual(keys.map(flagOfKey).filter((f) => !flags.has(f)), [], "ConfigMap keys")
      // Each key reaches the server: `--flag $(KEY)` in the args, through envFrom of this ConfigMap.
      for (const key of keys) {
        const at = args.indexOf(`$(${key})`)
        assert.isAbove(at, 0, `${key} is not in the args`)
        assert.strictEqual(args[at - 1], flagOfKey(key), key)
      }
      assert.deepStrictEqual(container().envFrom, [{ configMapRef: { name: configMap().metadata!.name! } }])
    }), 60_000)

  it("the DaemonSet: hostIPC, the fd socket on a hostPath, probes on /livez and /readyz, scrape annotations, memory from --l1-size-gb, the Secret's files", () => {
    const ds = daemonSet()
    const pod = ds.spec!.template
    const c = container()
    const args = c.args ?? []
    const arg = (flag: string) => args[args.indexOf(flag) + 1]!
    assert.isTrue(pod.spec!.hostIPC)
    // The descriptor socket and the ipc endpoint sit in the hostPath mount.
    const run = pod.spec!.volumes!.find((v) => v.name === "run")!
    assert.deepStrictEqual(run.hostPath, { path: "/run/mpcache", type: "DirectoryOrCreate" })
    const runMount = c.volumeMounts!.find((m) => m.name === "run")!.mountPath
    assert.isTrue(arg("--fd-socket").startsWith(`${runMount}/`), arg("--fd-socket"))
    assert.isTrue(arg("--endpoint").startsWith(`ipc://${runMount}/`), arg("--endpoint"))
    // Probes on the HTTP port the server binds, on every address (kubelet comes from the node).
    const port = c.ports!.find((p) => p.name === "http")!.containerPort
    assert.strictEqual(arg("--http-port"), String(port))
    assert.strictEqual(arg("--http-host"), "0.0.0.0")
    assert.deepStrictEqual(c.livenessProbe!.httpGet, { path: "/livez", port: "http" })
    assert.deepStrictEqual(c.readinessProbe!.httpGet, { path: "/readyz", port: "http" })
    assert.deepStrictEqual(c.startupProbe!.httpGet, { path: "/livez", port: "http" })
    assert.deepStrictEqual(pod.metadata!.annotations, {
      "prometheus.io/scrape": "true",
      "prometheus.io/port": String(port),
      "prometheus.io/path": "/metrics"
    })
    // Memory: the L1 pool (in /dev/shm, charged to the pod) plus 1 GiB for the process, request = limit.
    const l1Gb = Number(configMap().data!["MPCACHE_L1_SIZE_GB"])
    assert.strictEqual(c.resources!.requests!["memory"], `${l1Gb + 1}Gi`)
    assert.strictEqual(c.resources!.limits!["memory"], `${l1Gb + 1}Gi`)
    // Every secret file a flag names is a key of the Secret mounted there.
    const secretsMount = c.volumeMounts!.find((m) => m.name === "secrets")!
    assert.isTrue(secretsMount.readOnly)
    assert.strictEqual(pod.spec!.volumes!.find((v) => v.name === "secrets")!.secret!.secretName, secret().metadata!.name)
    const files = ["--http-token-file", "--curve-secret-key-file", "--curve-authorized-keys"].map((f) => arg(f))
    assert.deepStrictEqual(
      files.map((f) => f.slice(secretsMount.mountPath.length + 1)).sort(),
      Object.keys(secret().stringData ?? {}).sort()
    )
  })

  it.live("the DaemonSet's args, with the ConfigMap's values, start a real server that is ready", () =>
    Effect.scoped(Effect.gen(function*() {
      const tmp = mkdtempSync(join(tmpdir(), "mpcache-k8s-"))
      yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(tmp, { recursive: true, force: true })))
      const c = container()
      const secretsDir = c.volumeMounts!.find((m) => m.name === "secrets")!.mountPath
      const runDir = c.volumeMounts!.find((m) => m.name === "run")!.mountPath
      // The Secret's files, real this time: a server key pair, one client's public key, a token.
      for (const name of ["server", "client"]) {
        const made = yield* runCli(["keygen", join(tmp, name)], 30_000)
        assert.strictEqual(made.code, 0, made.stderr)
      }
      const clientPub = readFileSync(join(tmp, "client.pub"), "utf8").trim()
      writeFileSync(join(tmp, "authorized_keys"), `${clientPub} tenant-a\n`, { mode: 0o600 })
      writeFileSync(join(tmp, "http-token"), "k8s-test-token-0123456789abcdef\n", { mode: 0o400 })
      const env = configMap().data!
      const args = (c.args ?? []).map((a) => {
        const key = /^\$\((\w+)\)$/.exec(a)?.[1]
        const value = key === undefined ? a : env[key]!
        return value.replace(secretsDir, tmp).replace(runDir, tmp)
      })
      // What a test machine can hold and reach: a small L1, an ephemeral HTTP port on loopback.
      const set = (flag: string, value: string) => (args[args.indexOf(flag) + 1] = value)
      set("--l1-size-gb", "0.0625")
      set("--http-port", "0")
      set("--http-host", "127.0.0.1")
      assert.deepStrictEqual(c.command, ["mpcache", "serve"])
      const server = yield* startCli(["serve", ...args, "--no-l1-prefault"])
      const [, port] = yield* server.waitForStderr(/HTTP frontend listening on http:\/\/127\.0\.0\.1:(\d+)/, 60_000)
      const ready = yield* eventually(
        Effect.promise(() => fetch(`http://127.0.0.1:${port}/readyz`).then(async (r) => ({ status: r.status, body: await r.text() }))),
        (r) => r.status === 200,
        30_000
      )
      assert.strictEqual(ready.status, 200, ready.body)
      const body = JSON.parse(ready.body) as { readonly checks: ReadonlyArray<{ readonly name: string; readonly ok: boolean; readonly detail: string }> }
      assert.deepStrictEqual(body.checks.find((x) => x.name === "fd_socket"), {
        name: "fd_socket",
        ok: true,
        detail: "configured (--fd-socket) and listening"
      })
      // The rest of the frontend keeps its token.
      assert.strictEqual((yield* Effect.promise(() => fetch(`http://127.0.0.1:${port}/metrics`))).status, 401)
    })), 120_000)
})
