"""The package layout holds: the model core imports nothing of ours, and no module imports
itself back through others (lazy imports inside functions count too)."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("seqenc", "parsers", "training", "dags")


def _modules() -> dict[str, Path]:
    mods = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = path
    return mods


def _imports(path: Path, known) -> set[str]:
    """Our modules that ``path`` imports anywhere in its body (``from a import b`` may name a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name in known}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(path, mods) - {name} for name, path in mods.items()}


def test_model_core_imports_nothing_of_ours():
    outside = sorted((m, d) for m, deps in _graph().items() if m.split(".")[0] == "seqenc"
                     for d in deps if d.split(".")[0] != "seqenc")
    assert outside == [], f"seqenc/ must import neither parsers/ nor training/: {outside}"


def test_parsers_import_no_training():
    up = sorted((m, d) for m, deps in _graph().items() if m.split(".")[0] == "parsers"
                for d in deps if d.split(".")[0] in ("training", "dags"))
    assert up == [], up


def test_no_import_cycles():
    graph = _graph()
    cycles = []
    for start in graph:  # a module lies on a cycle when it can reach itself
        seen, stack = set(), list(graph[start])
        while stack:
            node = stack.pop()
            if node == start:
                cycles.append(start)
                break
            if node not in seen:
                seen.add(node)
                stack.extend(graph[node])
    assert cycles == [], f"modules on an import cycle: {sorted(cycles)}"


def test_the_graph_sees_imports():
    """The checks above are only as good as the graph: it must see a known edge, lazy ones included."""
    graph = _graph()
    assert "seqenc.model" in graph["seqenc.pretrained"]
    assert "training.deepspeed_engine" in graph["training.engines"]  # imported inside make_engine
