"""policies/ imports only the standard library and itself (no Ray, JAX, I/O libraries)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import policies

FORBIDDEN_CALLS = {"open", "time", "sleep", "random", "monotonic", "perf_counter"}


def _modules() -> list[Path]:
    return sorted(Path(policies.__file__).parent.glob("*.py"))


def test_policies_import_only_stdlib():
    """Every import in policies/ is a stdlib module or policies itself."""
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top == "policies" or top in sys.stdlib_module_names, f"{path.name}: {name}"
                assert top not in {"time", "random", "os", "socket", "threading"}, \
                    f"{path.name} imports {top}: pass time/randomness in instead"


def test_policies_do_not_call_clocks_or_files():
    """No calls to open(), time.time(), sleep() or random() in policies/."""
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                fn = node.func
                name = fn.id if isinstance(fn, ast.Name) else getattr(fn, "attr", "")
                assert name not in FORBIDDEN_CALLS, f"{path.name} calls {name}()"
