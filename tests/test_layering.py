"""Import rules of ARCHITECTURE.md, checked on the source (AST), and a light ``import simulator``."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "simulator"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _modules():
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        yield rel.parts[0] if len(rel.parts) > 1 else rel.stem, path, _imports(path)


def _uses(imports: set[str], top: str) -> bool:
    return any(name == top or name.startswith(top + ".") for name in imports)


def test_heavy_libraries_stay_in_their_stage():
    rules = {"simpy": {"engine"}, "plotly": {"viz"}, "torch": {"calibrate"}}
    for stage, path, imports in _modules():
        for lib, allowed in rules.items():
            if _uses(imports, lib):
                assert stage in allowed, f"{path} imports {lib}"


def test_pure_stages_never_import_engine_results_or_viz():
    for stage, path, imports in _modules():
        if stage in ("costs", "cluster", "workload"):
            for banned in ("simulator.engine", "simulator.results", "simulator.viz"):
                assert not _uses(imports, banned), f"{path} imports {banned}"


def test_costs_are_pure():
    for stage, path, imports in _modules():
        if stage == "costs":
            internal = {i for i in imports if i.startswith("simulator")}
            assert internal <= {"simulator.units", "simulator.costs", "simulator.costs.compute",
                                "simulator.costs.collectives", "simulator.costs.flops", "simulator.costs.memory"}, path


def test_results_depend_on_nothing_but_units():
    for stage, path, imports in _modules():
        if stage == "results":
            internal = {i for i in imports if i.startswith("simulator") and not i.startswith("simulator.results")}
            assert internal <= {"simulator.units", "simulator.errors", "simulator"}, (path, internal)


def test_import_simulator_is_light():
    code = ("import sys, simulator; heavy = [m for m in ('torch', 'plotly', 'dask', 'ray') if m in sys.modules]; "
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
