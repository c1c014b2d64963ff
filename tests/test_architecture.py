"""The package's shape: no import cycles, and imports pointing one way down the stages.

    frontend / dialects at the bottom, then passes, fusion, codegen, lowering, runtime, report and the API,
    with the operator library and the command line above the API.
Every `import` and `from ... import` of a dlblas_compiler module is read from the source (also those inside
functions): an upward edge or a cycle fails with the modules that make it.
"""

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parents[1] / "dlblas_compiler"

# Each stage may import the stages in earlier rows (and itself), never a later one.
LAYERS = [
    {"errors", "numerics", "models", "logs"},
    {"dialects"},
    {"frontend", "passes", "tuning"},
    {"fusion"},
    {"codegen"},
    {"lowering"},
    {"runtime"},
    {"report", "options"},
    {"api"},
    {"library", "dynamo", "cli", "__init__"},
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> nx.DiGraph:
    """Module -> module edges within the package."""
    graph = nx.DiGraph()
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    for mod, path in modules.items():
        graph.add_node(mod)
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                targets = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in modules else prefix for a in node.names]
            for t in targets:
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != mod and t.startswith("dlblas_compiler"):
                    graph.add_edge(mod, t)
    return graph


def _stage(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_no_import_cycles():
    cycles = list(nx.simple_cycles(_imports()))
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_imports_point_down_the_stages():
    graph = _imports()
    stages = {_stage(m) for m in graph}
    assert stages <= set(RANK), f"stages without a layer: {stages - set(RANK)}"
    upward = [(a, b) for a, b in graph.edges if RANK[_stage(b)] > RANK[_stage(a)]]
    assert not upward, f"imports against the stage order: {upward}"


def test_dialects_import_nothing_above_them():
    graph = _imports()
    above = [(a, b) for a, b in graph.edges if _stage(a) == "dialects" and _stage(b) != "dialects"]
    assert not above, above
