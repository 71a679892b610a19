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
    assert "training.engine.deepspeed_engine" in graph["training.engine.engines"]  # imported inside make_engine


# --- the rooms of training/ (docs/architecture.md) -------------------------------------------------
# lower rooms first: a module imports its own room and the rooms before it, never one after it
ROOMS = ("tasks", "engine", "serving", "pipeline", "airflow", "bench", "cli")
# registries are leaves: they import nothing of training/, and any room may read them
REGISTRIES = {"training.tasks.kinds", "training.engine.modes", "training.engine.sizes"}


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "training" and len(parts) > 2 and parts[1] in ROOMS else None


def test_training_holds_only_rooms():
    """training/'s top level is the rooms and the package marker: every module lives in a room."""
    top = sorted(p.name for p in (REPO / "training").iterdir() if not p.name.startswith(("__pycache__", ".")))
    assert top == sorted([*ROOMS, "__init__.py"]), top


def test_rooms_import_only_rooms_below_them():
    upward = []
    for module, deps in _graph().items():
        room = _room(module)
        if room is None:
            continue
        for dep in deps:
            dep_room = _room(dep)
            if dep in REGISTRIES or dep_room is None:
                continue
            if ROOMS.index(dep_room) > ROOMS.index(room) and not (room == "cli"):
                upward.append((module, dep))
    assert upward == [], f"imports from a later room (docs/architecture.md): {sorted(upward)}"


def test_registries_are_leaves():
    graph = _graph()
    leaking = {name: sorted(d for d in graph[name] if d.startswith("training.")) for name in REGISTRIES}
    assert all(not deps for deps in leaking.values()), leaking


def test_only_the_cli_imports_the_benches():
    """Product code never imports a benchmark; the CLI starts them."""
    users = sorted(m for m, deps in _graph().items() if _room(m) not in ("bench", "cli")
                   and any(d.startswith("training.bench") for d in deps))
    assert users == [], users


def test_dag_files_call_only_training_airflow():
    """A DAG file declares its graph; what its tasks do lives in training.airflow (one module per
    DAG). Its params may list a registry's names (cheap: registries import nothing)."""
    graph = _graph()
    for name in (m for m in graph if m.startswith("dags.")):
        assert all(d.startswith("training.airflow") or d in REGISTRIES for d in graph[name]), (name, graph[name])


def test_the_model_core_holds_no_deployment_knowledge():
    """The catalogue, names from users, training modes and task kinds live outside seqenc/."""
    core = {p.stem for p in (REPO / "seqenc").glob("*.py")}
    assert not core & {"catalog", "modes", "kinds"}, core
    text = (REPO / "seqenc" / "config.py").read_text()
    assert "TRAINING_MODES" not in text and "TASK_MODEL_DEFAULTS" not in text
