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
            allowed = {"simulator.units", "simulator.ir"}
            assert all(i in allowed or i == "simulator.costs" or i.startswith("simulator.costs.") for i in internal), (
                path, internal)


def test_results_depend_on_nothing_but_units_the_program_types_and_pure_costs():
    for stage, path, imports in _modules():
        if stage == "results":
            internal = {i for i in imports if i.startswith("simulator") and not i.startswith("simulator.results")}
            internal -= {i for i in internal if i.startswith("simulator.costs")}
            assert internal <= {"simulator.units", "simulator.errors", "simulator", "simulator.ir"}, (path, internal)


def test_import_simulator_is_light():
    code = ("import sys, simulator; heavy = [m for m in ('torch', 'plotly', 'dask', 'ray') if m in sys.modules]; "
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# -- the shape of the package (issue 11): no import cycles, small modules, registries in step ----

MAX_MODULE_LINES = 400


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _import_graph():
    """Explicit imports between simulator modules, anywhere in a file (function-local and
    TYPE_CHECKING imports included: a cycle hidden behind them is still a cycle of concepts).
    ``from pkg import name`` points at ``pkg.name`` when that is a module, else at ``pkg``."""
    import networkx as nx

    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                if target in modules and target != name:
                    graph.add_edge(name, target)
    return graph


def test_no_import_cycles():
    import networkx as nx

    cycles = [c for c in nx.simple_cycles(_import_graph()) if len(c) > 1]
    assert not cycles, "import cycles: " + "; ".join(" -> ".join([*c, c[0]]) for c in cycles[:5])


def test_no_module_is_too_long():
    long = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def _literal_values(annotation) -> set:
    from typing import get_args

    return set(get_args(annotation))


def test_registries_match_their_scenario_tags():
    """Every registry keyed by a scenario ``Literal`` holds exactly that literal's values."""
    from simulator.cluster.fabrics import FABRICS
    from simulator.engine.network import NETWORK_MODELS
    from simulator.scenario.fabric import FabricKind
    from simulator.scenario.spec import PipelineSchedule, Scenario, Sharding
    from simulator.workload.data_parallel import STRATEGIES
    from simulator.workload.pipeline import SCHEDULES

    assert set(STRATEGIES) == _literal_values(Sharding)
    assert set(SCHEDULES) == _literal_values(PipelineSchedule)
    assert set(FABRICS) == _literal_values(FabricKind)
    assert set(NETWORK_MODELS) == _literal_values(Scenario.model_fields["sim"].annotation.model_fields["network"].annotation)
    from simulator.catalog import default_catalog
    from simulator.scenario.framework import GENERIC, Framework

    # framework profiles are data: one file per framework tag, none for generic (dtsim's defaults)
    assert set(default_catalog().framework_names()) == _literal_values(Framework) - {GENERIC}
