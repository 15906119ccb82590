"""The dashboard's structure type-checks against Grafana's published schema types (@grafana/schema).

The JSON is written into a TypeScript file as object literals (so excess properties are errors), the
whole dashboard typed as `Dashboard` and every panel additionally as `Panel<Options, FieldConfig>` of its
panel plugin's generated option types, and `tsc --noEmit` checks it. Grafana's string enums (threshold and
color modes) are compared by their values, which is what the JSON holds.

TypeScript and @grafana/schema come from npm, pinned by tests/dashboards/package-lock.json and installed
into tests/dashboards/node_modules (git-ignored) by `scripts/setup --test`, or by this test when missing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))

# Panel plugin -> (options type, field-config type) from @grafana/schema's generated panel configs.
PANEL_TYPES = {
    "timeseries": ("TimeSeriesPanelCfg", True),
    "table": ("TablePanelCfg", True),
    "stat": ("StatPanelCfg", False),
    "heatmap": ("HeatmapPanelCfg", True),
}
_DIR = {"TimeSeriesPanelCfg": "timeseries", "TablePanelCfg": "table", "StatPanelCfg": "stat",
        "HeatmapPanelCfg": "heatmap"}

PRELUDE = """\
import type {{ Dashboard, Panel, RowPanel }} from '@grafana/schema';
{imports}

// JSON holds enum *values*: compare string enums by their literal values, keep the rest as declared.
type JsonOf<T> = T extends string ? `${{T}}`
  : T extends readonly (infer U)[] ? JsonOf<U>[]
  : T extends object ? {{ [K in keyof T]: JsonOf<T[K]> }}
  : T;
"""


def node_modules() -> Path:
    modules = HERE / "node_modules"
    if not (modules / "typescript" / "bin" / "tsc").exists() or not (modules / "@grafana" / "schema").exists():
        npm = shutil.which("npm")
        assert npm, "npm is needed to install TypeScript and @grafana/schema (Debian: nodejs, npm)"
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=HERE, check=True, timeout=300,
                       capture_output=True)
    return modules


def panels_of(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard.get("panels", []):
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def typescript_for(dashboard: dict[str, Any]) -> str:
    # __inputs (and __requires) describe an import, not the dashboard: Grafana's importer reads and drops
    # them, so the model the schema types never has them (test_dashboard_metrics.py checks them).
    dashboard = {k: v for k, v in dashboard.items() if k not in ("__inputs", "__requires")}
    imports = []
    for cfg, has_field_config in PANEL_TYPES.values():
        path = f"@grafana/schema/dist/esm/raw/composable/{_DIR[cfg]}/panelcfg/x/{cfg}_types.gen"
        names = f"Options as {cfg}Options" + (f", FieldConfig as {cfg}FieldConfig" if has_field_config else "")
        imports.append(f"import type {{ {names} }} from '{path}';")
    lines = [PRELUDE.format(imports="\n".join(imports))]
    for n, panel in enumerate(panels_of(dashboard)):
        kind = panel.get("type")
        if kind == "row":
            type_name = "RowPanel"
        elif kind in PANEL_TYPES:
            cfg, has_field_config = PANEL_TYPES[kind]
            # Panel<TOptions> does not apply TOptions to `options` (it is Record<string, unknown> there):
            # type the options with the plugin's own Options explicitly.
            field_config = f"{cfg}FieldConfig" if has_field_config else "Record<string, unknown>"
            type_name = f"Omit<Panel<unknown, {field_config}>, 'options'> & {{ options: {cfg}Options }}"
        else:
            type_name = "Panel"  # a plugin without published option types (flamegraph)
        lines.append(f"export const panel{n}: JsonOf<{type_name}> = {json.dumps(panel, indent=2)};")
    lines.append(f"export const dashboard: JsonOf<Dashboard> = {json.dumps(dashboard, indent=2)};")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.name for p in DASHBOARDS])
def test_dashboard_type_checks(path: Path, tmp_path: Path) -> None:
    modules = node_modules()
    dashboard = json.loads(path.read_text())
    work = HERE / ".typecheck"  # inside tests/dashboards so that module resolution finds node_modules
    work.mkdir(exist_ok=True)
    source = work / f"{path.stem}.ts"
    source.write_text(typescript_for(dashboard))
    result = subprocess.run(
        ["node", str(modules / "typescript" / "bin" / "tsc"), "-p", str(HERE / "tsconfig.json")],
        cwd=HERE, capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0, f"tsc found errors in {source}:\n{result.stdout}{result.stderr}"


def test_a_wrong_dashboard_fails_the_check() -> None:
    # The check itself must be able to fail: a misspelt property and a wrong enum value.
    modules = node_modules()
    dashboard = json.loads(DASHBOARDS[0].read_text())
    dashboard["panels"][1]["gridPos"]["width"] = 3
    dashboard["panels"][1]["fieldConfig"]["defaults"]["thresholds"]["mode"] = "relative"
    heatmap = next(p for p in dashboard["panels"] if p["type"] == "heatmap")
    heatmap["options"]["yAxis"]["unitt"] = "s"
    work = HERE / ".typecheck-negative"
    work.mkdir(exist_ok=True)
    (work / "broken.ts").write_text(typescript_for(dashboard))
    tsconfig = work / "tsconfig.json"
    tsconfig.write_text(json.dumps({"extends": "../tsconfig.json", "include": ["broken.ts"]}))
    result = subprocess.run(["node", str(modules / "typescript" / "bin" / "tsc"), "-p", str(tsconfig)],
                            cwd=HERE, capture_output=True, text=True, timeout=240)
    assert result.returncode != 0
    assert "width" in result.stdout and "relative" in result.stdout and "unitt" in result.stdout
