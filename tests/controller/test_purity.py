"""The controller package decides and sequences; Ray and JAX stay behind the seam."""

from __future__ import annotations

import ast
from pathlib import Path

import orchestrator.controller as pkg

FORBIDDEN = ("ray", "jax", "jaxlib", "flax", "optax", "orbax", "workers")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_controller_package_imports_neither_ray_nor_jax():
    files = sorted(Path(pkg.__file__).parent.glob("*.py"))
    assert len(files) >= 10
    for f in files:
        bad = _imports(f) & set(FORBIDDEN)
        assert not bad, f"{f.name} imports {sorted(bad)}"


def test_no_controller_module_is_over_400_lines():
    for f in Path(pkg.__file__).parent.glob("*.py"):
        assert len(f.read_text().splitlines()) <= 400, f.name
