/**
 * What a test file loads at run time, followed through every relative import
 * (test/support, src, scripts), and which of those loads can start a process
 * (issue 26 item 3: the quick loop runs no child process, no Redis, no
 * browser; test/QuickSet.test.ts holds vitest.quick.config.ts to that).
 *
 * Parsed with TypeScript's own parser, so comments and strings are never
 * taken for imports; `import type` and `export type` are skipped (erased at
 * run time). Packages and `node:` modules are leaves: their names are judged
 * by {@link processReason}, their insides are not read.
 */
import { existsSync, readFileSync } from "node:fs"
import path from "node:path"
import ts from "typescript"

/** One run-time import: the module named and the bindings taken from it. */
interface Load {
  readonly specifier: string
  readonly names: ReadonlyArray<string>
}

/**
 * Why a load can start a process, or `undefined` when it cannot. A name that
 * is not here does not start one: zeromq, msgpackr, the redis client (it
 * only connects; the Redis servers come from test/support/RedisFleet.ts,
 * which spawns them), worker_threads (threads of this process).
 */
export const processReason = (load: Load): string | undefined => {
  const s = load.specifier
  if (/(^|\/|:)child_process$/.test(s)) return "node:child_process starts child processes"
  if (s === "node:cluster" || s === "cluster") return "node:cluster forks workers"
  if (s === "effect/process" || s.startsWith("effect/process/")) return "effect/process starts child processes"
  if (/^playwright(-core)?($|\/)/.test(s)) return "playwright starts a browser"
  const spawner = load.names.find((n) => /ChildProcess/.test(n))
  if (spawner !== undefined) return `${spawner} (from ${s}) starts child processes`
  return undefined
}

const scriptKind = (file: string): ts.ScriptKind => (file.endsWith(".ts") || file.endsWith(".mts") ? ts.ScriptKind.TS : ts.ScriptKind.JS)

// Parsed once per file: the closures of a hundred test files share src/ and test/support.
const parsed = new Map<string, ReadonlyArray<Load>>()

/** The run-time loads of one source file: static imports and re-exports (not type-only), and `import("…")` with a literal. */
export const loadsOf = (file: string): ReadonlyArray<Load> => {
  const known = parsed.get(file)
  if (known !== undefined) return known
  const source = ts.createSourceFile(file, readFileSync(file, "utf8"), ts.ScriptTarget.Latest, false, scriptKind(file))
  const loads: Array<Load> = []
  const visit = (node: ts.Node): void => {
    if (ts.isImportDeclaration(node) && ts.isStringLiteral(node.moduleSpecifier)) {
      const clause = node.importClause
      if (clause?.isTypeOnly !== true) {
        const names: Array<string> = []
        if (clause?.name !== undefined) names.push(clause.name.text)
        const bindings = clause?.namedBindings
        if (bindings !== undefined && ts.isNamedImports(bindings)) {
          for (const e of bindings.elements) if (!e.isTypeOnly) names.push((e.propertyName ?? e.name).text)
        }
        loads.push({ specifier: node.moduleSpecifier.text, names })
      }
    } else if (ts.isExportDeclaration(node) && node.moduleSpecifier !== undefined && ts.isStringLiteral(node.moduleSpecifier)) {
      if (!node.isTypeOnly) loads.push({ specifier: node.moduleSpecifier.text, names: [] })
    } else if (
      ts.isCallExpression(node) &&
      node.expression.kind === ts.SyntaxKind.ImportKeyword &&
      node.arguments[0] !== undefined &&
      ts.isStringLiteralLike(node.arguments[0])
    ) {
      loads.push({ specifier: node.arguments[0].text, names: [] })
    }
    ts.forEachChild(node, visit)
  }
  visit(source)
  parsed.set(file, loads)
  return loads
}

/** A load that can start a process, with the chain of files from the test file that led to it. */
export interface ProcessLoad {
  /** Repository-relative paths, the test file first, the file that loads `specifier` last. */
  readonly via: ReadonlyArray<string>
  readonly specifier: string
  readonly reason: string
}

/**
 * Every load in the closure of `testFile` (repository-relative) that can start
 * a process, each with the shortest chain of imports that reaches it (breadth
 * first). Fails (throws, naming both files) on a relative import that names
 * no file: a scanner that cannot follow an import cannot vouch for it.
 */
export const processLoads = (root: string, testFile: string): ReadonlyArray<ProcessLoad> => {
  const found: Array<ProcessLoad> = []
  const seen = new Set<string>([testFile])
  const queue: Array<ReadonlyArray<string>> = [[testFile]]
  for (let chain = queue.shift(); chain !== undefined; chain = queue.shift()) {
    const file = chain[chain.length - 1]!
    for (const load of loadsOf(path.join(root, file))) {
      if (load.specifier.startsWith(".")) {
        const target = path.relative(root, path.resolve(root, path.dirname(file), load.specifier)).split(path.sep).join("/")
        if (!existsSync(path.join(root, target))) throw new Error(`${file} imports ${load.specifier}, which names no file (${target})`)
        // Only code is read on; a data file (JSON, an addon) is a leaf.
        if (!seen.has(target) && /\.(m?ts|[mc]?js)$/.test(target)) {
          seen.add(target)
          queue.push([...chain, target])
        }
      } else {
        const reason = processReason(load)
        if (reason !== undefined) found.push({ via: chain, specifier: load.specifier, reason })
      }
    }
  }
  return found
}
