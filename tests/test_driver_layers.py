"""Layers inside the driver: every import points down, and no modules import each other in a circle.

``tests/test_import_direction.py`` keeps the hosts and the driver apart; this keeps the driver's
own rooms in order (docs/ARCHITECTURE.md, "Layers inside the driver"). A module belongs to the
layer of the longest prefix in ``LAYERS`` that names it; it may import modules of lower layers
and of its own package (its unit), not those of a higher layer, nor another package of its own
layer (peers stay independent). Imports are read with ``ast`` (nothing is imported), including
those inside functions and under ``TYPE_CHECKING``: a type named upward is still an arrow up.

The config sections (``controller.config``, ``events.config``, ``metrics.config``) are a layer
of their own, below everything they configure: they import only ``shared`` and ``policies``, and
the config tree (``orchestrator.config``) composes them. So a module may read another package's
section without importing that package's code.

``ALLOWED`` lists the arrows that still break a rule, each with its reason and what removes it;
an arrow not in it fails the test, and an entry no longer needed fails it too (the list only
shrinks).
"""

from __future__ import annotations

from pathlib import Path

from tests.test_import_direction import _is_module, _module_name, _under, imports_of

ROOT = Path(__file__).resolve().parent.parent

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("shared", ("orchestrator.shared",)),
    ("data, policies", ("orchestrator.data", "policies")),
    ("config sections", ("orchestrator.controller.config", "orchestrator.events.config",
                         "orchestrator.metrics.config")),
    ("config tree", ("orchestrator.config",)),
    ("lifecycle", ("orchestrator.lifecycle",)),
    ("events", ("orchestrator.events",)),
    ("controller", ("orchestrator.controller",)),
    ("raygroup, metrics", ("orchestrator.raygroup", "orchestrator.metrics")),
    ("cluster", ("orchestrator.cluster",)),
    ("tools", ("orchestrator.driver", "orchestrator.autoresume", "orchestrator.report",
               "orchestrator.export", "orchestrator.sim")),
    ("main", ("orchestrator.main",)),
)
"""Bottom to top. ``orchestrator`` itself (its ``__init__`` sets one environment default) is in
no layer."""

ALLOWED: dict[tuple[str, str], str] = {
    # The controller's circle context -> listener -> context: every listener method receives the
    # mutable ``Run`` (context). Goes when listeners receive immutable snapshots (issue 52, the
    # controller's state refactor), not by moving a definition.
    ("orchestrator.controller.listener", "orchestrator.controller.context"):
        "listener methods take Run; removed by the controller's state refactor",
    # context -> reactions -> context (and reactions -> stopping -> context): ``Run`` holds the
    # ``Reactions`` the Controller builds on it. Goes when ``Run`` shrinks to the wiring.
    ("orchestrator.controller.context", "orchestrator.controller.reactions"):
        "Run holds its Reactions; removed by the controller's state refactor",
}
"""(importer, imported) -> why it is still there. Cycles are checked without these edges."""


def layer_of(module: str) -> tuple[int, str] | None:
    """(layer index, the prefix that placed it) for the longest prefix naming ``module``."""
    best: tuple[int, str] | None = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if _under(module, prefix) and (best is None or len(prefix) > len(best[1])):
                best = (index, prefix)
    return best


def driver_modules(root: Path) -> dict[str, Path]:
    return {_module_name(p, root): p for p in sorted((root / "orchestrator").rglob("*.py"))}


def _as_module(name: str, root: Path) -> str:
    while name and not _is_module(name, root):
        name = name.rpartition(".")[0]
    return name


def arrows(root: Path) -> dict[tuple[str, str], tuple[str, int]]:
    """(importer, imported module) -> (file, first line) for every import between two driver
    modules (``orchestrator.*``; ``policies`` too, as a target)."""
    found: dict[tuple[str, str], tuple[str, int]] = {}
    for me, path in driver_modules(root).items():
        for line, imported in imports_of(path, root):
            if not (_under(imported, "orchestrator") or _under(imported, "policies")):
                continue
            target = _as_module(imported, root)
            if target and target != me:
                found.setdefault((me, target), (str(path.relative_to(root)), line))
    return found


def wrong_way(root: Path) -> list[str]:
    """Every arrow up a layer or across to a peer package, as ``file:line: a -> b (why)``."""
    out = []
    for (me, target), (file, line) in sorted(arrows(root).items()):
        mine, theirs = layer_of(me), layer_of(target)
        if mine is None or theirs is None or (me, target) in ALLOWED:
            continue
        if theirs[0] > mine[0]:
            why = f"up from {LAYERS[mine[0]][0]} to {LAYERS[theirs[0]][0]}"
        elif theirs[0] == mine[0] and theirs[1] != mine[1]:
            why = f"across the {LAYERS[mine[0]][0]} layer ({mine[1]} -> {theirs[1]})"
        else:
            continue
        out.append(f"{file}:{line}: {me} -> {target} ({why})")
    return out


def cycles(root: Path) -> list[list[str]]:
    """The driver's import circles (strongly connected sets of modules), ``ALLOWED`` edges left
    out: Tarjan's algorithm over the module graph."""
    graph: dict[str, set[str]] = {m: set() for m in driver_modules(root)}
    for me, target in arrows(root):
        if target in graph and (me, target) not in ALLOWED:
            graph[me].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            circle = []
            while True:
                w = stack.pop()
                circle.append(w)
                if w == v:
                    break
            if len(circle) > 1:
                found.append(sorted(circle))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_driver_module_has_a_layer():
    """A new package under orchestrator/ must be placed in LAYERS (and docs/ARCHITECTURE.md)."""
    unplaced = [m for m in driver_modules(ROOT) if m != "orchestrator" and layer_of(m) is None]
    assert not unplaced, f"modules in no layer (add their package to LAYERS): {unplaced}"


def test_driver_imports_point_down():
    found = wrong_way(ROOT)
    assert not found, ("imports up a layer or across peers inside the driver (move the shared "
                       "definition down, or pass it in from above):\n" + "\n".join(found))


def test_no_import_circles_in_the_driver():
    found = cycles(ROOT)
    assert not found, "import circles inside the driver:\n" + "\n".join(map(str, found))


def test_every_allowed_arrow_still_exists():
    """The allow-list only shrinks: an entry whose import is gone must be removed."""
    present = arrows(ROOT)
    stale = [edge for edge in ALLOWED if edge not in present]
    assert not stale, f"ALLOWED entries no longer imported (remove them): {stale}"


def test_the_checker_names_an_upward_arrow_and_a_circle(tmp_path):
    files = {
        "orchestrator/__init__.py": "",
        "orchestrator/shared/__init__.py": "",
        "orchestrator/shared/errors.py": "import os\n",
        "orchestrator/events/__init__.py": "",
        "orchestrator/events/config.py": "from orchestrator.shared import errors\n",
        "orchestrator/events/model.py": "from orchestrator.shared import errors\n",
        "orchestrator/events/bad.py": ("def f():\n"
                                       "    from orchestrator.raygroup import group\n"),
        "orchestrator/events/a.py": "from orchestrator.events import b\n",
        "orchestrator/events/b.py": "from orchestrator.events import a\n",
        "orchestrator/controller/__init__.py": "",
        "orchestrator/controller/core.py": ("from orchestrator.events import model\n"
                                            "from orchestrator.events.config import X\n"),
        "orchestrator/raygroup/__init__.py": "",
        "orchestrator/raygroup/group.py": "from orchestrator.controller import core\n",
        "orchestrator/metrics/__init__.py": "",
        "orchestrator/metrics/sink.py": "from orchestrator.raygroup import group\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert wrong_way(tmp_path) == [
        "orchestrator/events/bad.py:2: orchestrator.events.bad -> orchestrator.raygroup.group "
        "(up from events to raygroup, metrics)",
        "orchestrator/metrics/sink.py:1: orchestrator.metrics.sink -> "
        "orchestrator.raygroup.group (across the raygroup, metrics layer (orchestrator.metrics "
        "-> orchestrator.raygroup))",
    ]
    assert cycles(tmp_path) == [["orchestrator.events.a", "orchestrator.events.b"]]
