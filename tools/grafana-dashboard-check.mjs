// A Grafana dashboard JSON checked against Grafana's own types (npm "@grafana/schema": the Dashboard, Panel and
// VariableModel shapes Grafana generates from its CUE schema, and each panel plugin's Options and FieldConfig),
// by the TypeScript compiler (npm "typescript") with its excess-property checks: an unknown or misspelt key, a
// wrong type, a missing required option or an unknown panel type is an error. One line per problem, exit 1 on any.
// .ci/run installs both packages beside a copy of this file and points GPUOPS_GRAFANA_CHECK_JS at it
// (tests/test_metrics_dashboard.py). Grafana itself is not packaged for Debian, and its schema ships as TypeScript.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import ts from "typescript";

// The panel types the dashboard may use: each plugin's generated types in @grafana/schema.
const PLUGINS = { timeseries: "TimeSeries", table: "Table", stat: "Stat" };
const here = dirname(fileURLToPath(import.meta.url));
const [path] = process.argv.slice(2);
const dashboard = JSON.parse(readFileSync(path, "utf8"));

const lines = [
  'import type { Dashboard } from "@grafana/schema";',
  ...Object.entries(PLUGINS).map(([kind, name]) =>
    `import type * as ${name} from "@grafana/schema/dist/esm/raw/composable/${kind}/panelcfg/x/${name}PanelCfg_types.gen";`),
  // JSON holds an enum's value, not the enum: each enum type as the union of its values, all else as declared.
  "type Json<T> = T extends string ? `${T}` : T extends number ? number : T extends boolean ? boolean",
  "  : T extends Array<infer E> ? Array<Json<E>> : T extends object ? { [K in keyof T]: Json<T[K]> } : T;",
  `export const dashboard: Json<Dashboard> = ${JSON.stringify(dashboard, null, 2)};`,
];
let bad = 0;
for (const panel of dashboard.panels ?? []) {
  const name = PLUGINS[panel.type];
  if (!name) {
    console.log(`${path}: panel ${panel.id} (${panel.title}): panel type '${panel.type}' is not one of ${Object.keys(PLUGINS)}`);
    bad++;
    continue;
  }
  lines.push(`export const options_${panel.id}: Json<${name}.Options> = ${JSON.stringify(panel.options ?? {})};`);
  const custom = panel.fieldConfig?.defaults?.custom;  // optional: Grafana fills in what a panel leaves out
  if (custom !== undefined) lines.push(`export const custom_${panel.id}: Partial<Json<${name}.FieldConfig>> = ${JSON.stringify(custom)};`);
}

const dir = mkdtempSync(join(here, ".check-"));  // beside node_modules, so the imports resolve
const file = join(dir, "dashboard.ts");
writeFileSync(file, lines.join("\n") + "\n");
try {
  const program = ts.createProgram([file], {
    strict: true, noEmit: true, skipLibCheck: true, target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ESNext,
    moduleResolution: ts.ModuleResolutionKind.Bundler,
  });
  for (const d of ts.getPreEmitDiagnostics(program)) {
    const where = d.file ? d.file.getLineAndCharacterOfPosition(d.start ?? 0) : null;
    const text = where ? d.file.text.split("\n")[where.line].trim().slice(0, 160) : "";
    console.log(`${path}: ${ts.flattenDiagnosticMessageText(d.messageText, "\n  ")}${text ? `\n  at: ${text}` : ""}`);
    bad++;
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
process.exit(bad ? 1 : 0);
