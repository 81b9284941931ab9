#!/usr/bin/env node
// `npm test` (issue 26 item 1; docs/testing.md): the type check (`tsc --noEmit -p tsconfig.json`) and every test
// (`vitest run`, with this script's arguments) side by side instead of one after the other. The suite keeps both
// cores busy for most of its run but not all of it (its first seconds, its last files), and the type check's
// 25 s of CPU fill those gaps. The type check's output is printed after vitest's, so the two never interleave.
// Exits 0 only when both succeeded; a type error fails the run as before (the tests still run and report).
// Plain ESM JavaScript, run by the Node that npm puts first on PATH (the `node` devDependency's).
import { spawn } from "node:child_process"
import { fileURLToPath } from "node:url"

// The entries npm links for the devDependencies (vitest exports no path to its bin).
const bin = (name) => fileURLToPath(new URL(`../node_modules/.bin/${name}`, import.meta.url))
const tscBin = bin("tsc")
const vitestBin = bin("vitest")

/** A child's exit: its code, or 1 with the signal named when a signal ended it. */
const exited = (child, name) =>
  new Promise((resolve) => {
    child.once("error", (error) => {
      process.stderr.write(`npm test: ${name} could not start: ${error.message}\n`)
      resolve(1)
    })
    child.once("exit", (code, signal) => {
      if (signal !== null) process.stderr.write(`npm test: ${name} ended by ${signal}\n`)
      resolve(code ?? 1)
    })
  })

const tscOutput = []
const tsc = spawn(process.execPath, [tscBin, "--noEmit", "-p", "tsconfig.json"], { stdio: ["ignore", "pipe", "pipe"] })
tsc.stdout.on("data", (b) => tscOutput.push(b))
tsc.stderr.on("data", (b) => tscOutput.push(b))
const vitest = spawn(process.execPath, [vitestBin, "run", ...process.argv.slice(2)], { stdio: "inherit" })

// Ctrl-C or a CI's SIGTERM reaches both (a terminal's Ctrl-C reaches the process group anyway; a kill by pid does not).
for (const signal of ["SIGINT", "SIGTERM"]) {
  process.on(signal, () => {
    for (const child of [tsc, vitest]) if (child.exitCode === null) child.kill(signal)
  })
}

const [tscCode, vitestCode] = await Promise.all([exited(tsc, "tsc"), exited(vitest, "vitest")])
const text = Buffer.concat(tscOutput).toString("utf8")
if (tscCode === 0) {
  process.stdout.write("\ntype check (tsc --noEmit -p tsconfig.json): no errors\n")
} else {
  process.stdout.write(`\ntype check (tsc --noEmit -p tsconfig.json) FAILED (exit ${tscCode}):\n${text}`)
}
process.exitCode = tscCode !== 0 ? tscCode : vitestCode
