"""Which side may import which: the folders show the architecture, and this keeps them honest.

Two sides run in different processes. The driver is ``orchestrator.*`` (the config tree, the
controller, ``raygroup``, events, metrics, ...). The hosts are ``workers.*``: the host actor
(``workers.host``), the training core (``workers.training``), the RAM tier (``workers.ram``), the
task API and input pipeline (``workers.task``, ``workers.input``, ``workers.models``); users'
tasks (``examples``) run there too. What both need lives in ``orchestrator.shared`` (errors, the
host's spec, the mesh plan, the host environment, the run-dir layout, the task reference and the
config sections a host receives); ``orchestrator.data`` is the prepared-data format, read by
both.

``policies`` is declared pure and importable by both sides (standard library only, checked by
``tests/policies/test_purity.py``): the host's RAM-tier sender asks
``policies.ram_tier.copy_due`` whether a step is copied, the same pure function the driver's side
reasons with, rather than being handed that decision per step through its spec.

Rules, over every import in orchestrator/, workers/, policies/ and examples/ (statements at the
top of a module or inside a function; ``from X import y`` counts as ``X.y`` where that is a
module; ``importlib.import_module("...")`` and ``__import__("...")`` with a literal name):

1. ``workers.*`` and ``examples`` import from ``orchestrator`` only ``orchestrator.shared.*``
   and ``orchestrator.data.*``.
2. The driver (``orchestrator.*`` but ``shared`` and ``data``) imports from ``workers`` only the
   entry points in ``DRIVER_MAY_IMPORT``, each with its reason.
3. ``orchestrator.shared`` imports nothing of ``orchestrator`` outside itself, nothing of
   ``workers``, and none of Ray, JAX, Flax, Optax or Orbax.
4. ``orchestrator.data`` (what the hosts read) imports nothing of ``orchestrator`` outside
   itself and ``shared``, nothing of ``workers``.
5. ``policies`` imports nothing of ``orchestrator`` or ``workers``.

And a host's process does not load the config tree: importing every ``workers`` module in a
fresh interpreter leaves no ``orchestrator`` module loaded outside ``shared`` and ``data``.

Other projects' private modules (``PRIVATE``) are imported by their one wrapper module only
(``tests/test_private_apis.py`` checks what each wrapper uses still exists).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("orchestrator", "workers", "policies", "examples")
HOST_SIDE = ("workers", "examples")
"""``examples`` are users' tasks: they run in a host's process, so rule 1 holds for them too."""
HEAVY = ("ray", "jax", "jaxlib", "flax", "optax", "orbax")

DRIVER_MAY_IMPORT: dict[str, str] = {
    "workers.host.actor": "the HostActor class Ray creates for each host (raygroup.group)",
    "workers.ram.holder": "the RamHolder actor class Ray creates per node (raygroup.ram_holders)",
    "workers.ram.copy_store": "where the holders' durable copies are and which are complete "
                              "(raygroup.ram_holders), read by the export",
    "workers.ram.replica": "the export's offline reader of a RAM copy (leaf names, assembly)",
    "workers.ram.auth": "the export verifying a RAM copy's MAC before reading it",
    "workers.task.contract": "the export's rebuild of the exported model from its config "
                             "(orchestrator.export.rebuild: the task's context)",
    "workers.task.resolve": "the export's rebuild of the exported model from its config "
                            "(orchestrator.export.rebuild: the task's factory)",
    "workers.models.hf_llama": "the export's Hugging Face format of a llama run "
                               "(orchestrator.export.hf: config.json, tensor names and layouts)",
    "workers.models.safetensors_io": "the export writing safetensors one tensor at a time, "
                                     "bfloat16 included (orchestrator.export.hf)",
}

PRIVATE: dict[str, str] = {
    "ray._private": "orchestrator.raygroup.ray_private",
    "jax._src": "workers.training.jax_private",
    "orbax.checkpoint._src": "workers.host.orbax_private",
}
"""Private module prefix -> the one module that may import it."""


@dataclass(frozen=True)
class Violation:
    file: str
    line: int
    imported: str
    rule: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: imports {self.imported}: {self.rule}"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str, root: Path) -> bool:
    base = root.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports_of(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in ``path``: statements anywhere in the file, and
    ``importlib.import_module`` / ``__import__`` calls with a literal name."""
    me = _module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                out.append((node.lineno, sub if _is_module(sub, root) else module))
        elif isinstance(node, ast.Call) and node.args:
            fn = node.func
            name = fn.id if isinstance(fn, ast.Name) else getattr(fn, "attr", "")
            arg = node.args[0]
            if (name in ("import_module", "__import__") and isinstance(arg, ast.Constant)
                    and isinstance(arg.value, str)):
                out.append((node.lineno, arg.value))
    return out


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def rule_broken(importer: str, imported: str) -> str | None:
    """The rule ``importer`` importing ``imported`` breaks, or None."""
    top = imported.split(".")[0]
    neutral = ("orchestrator.shared", "orchestrator.data")
    if any(_under(importer, side) for side in HOST_SIDE):
        if top == "orchestrator" and not any(_under(imported, p) for p in neutral):
            return ("rule 1: workers (and the example tasks) may import from orchestrator only "
                    "orchestrator.shared.* and orchestrator.data.*")
    elif _under(importer, "orchestrator.shared"):
        if top in ("orchestrator", "workers") and not _under(imported, "orchestrator.shared"):
            return ("rule 3: orchestrator.shared imports nothing of orchestrator outside "
                    "itself or of workers")
        if top in HEAVY:
            return f"rule 3: orchestrator.shared imports none of {', '.join(HEAVY)}"
    elif _under(importer, "orchestrator.data"):
        if top == "workers" or (top == "orchestrator"
                                and not any(_under(imported, p) for p in neutral)):
            return ("rule 4: orchestrator.data (read by the hosts) imports only itself and "
                    "orchestrator.shared of orchestrator, nothing of workers")
    elif _under(importer, "orchestrator"):
        if top == "workers" and not any(_under(imported, m) for m in DRIVER_MAY_IMPORT):
            return (f"rule 2: the driver imports from workers only {sorted(DRIVER_MAY_IMPORT)} "
                    "(DRIVER_MAY_IMPORT)")
    elif _under(importer, "policies") and top in ("orchestrator", "workers"):
        return "rule 5: policies imports nothing of orchestrator or workers"
    return None


def check(root: Path) -> list[Violation]:
    found = []
    for package in PACKAGES:
        if not (root / package).is_dir():
            continue
        for path in sorted((root / package).rglob("*.py")):
            importer = _module_name(path, root)
            for line, imported in imports_of(path, root):
                rule = rule_broken(importer, imported)
                if rule:
                    found.append(Violation(str(path.relative_to(root)), line, imported, rule))
    return found


def test_imports_point_the_right_way():
    found = check(ROOT)
    assert not found, "wrong-way imports:\n" + "\n".join(map(str, found))


def test_private_modules_only_in_their_wrappers():
    """``ray._private``, ``jax._src`` and ``orbax.checkpoint._src`` only in their wrapper, so a
    release that moves one breaks one module, pinned and checked by tests/test_private_apis.py."""
    found = [f"{path.relative_to(ROOT)}:{line}: imports {imported}: use {wrapper}"
             for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
             for line, imported in imports_of(path, ROOT)
             for prefix, wrapper in PRIVATE.items()
             if _under(imported, prefix) and _module_name(path, ROOT) != wrapper]
    assert not found, "private modules imported outside their wrapper:\n" + "\n".join(found)
    for wrapper in PRIVATE.values():
        assert _is_module(wrapper, ROOT), f"{wrapper} in PRIVATE is not a module"


def test_the_driver_allowlist_is_all_used_and_exists():
    """Every allowed entry point exists and is imported by the driver (the list stays minimal)."""
    used = {imported for package in ("orchestrator",)
            for path in (ROOT / package).rglob("*.py")
            if not _under(_module_name(path, ROOT), "orchestrator.shared")
            for _, imported in imports_of(path, ROOT)}
    for name in DRIVER_MAY_IMPORT:
        assert _is_module(name, ROOT), f"{name} in DRIVER_MAY_IMPORT is not a module"
        assert name in used, f"{name} in DRIVER_MAY_IMPORT is imported by no driver module"


def test_the_checker_names_a_wrong_way_import(tmp_path):
    files = {
        "orchestrator/__init__.py": "",
        "orchestrator/config.py": "X = 1\n",
        "orchestrator/shared/__init__.py": "",
        "orchestrator/shared/errors.py": "import os\n",
        "workers/__init__.py": "",
        "workers/fine.py": "from orchestrator.shared import errors\n",
        "workers/bad.py": ("import os\n"
                           "\n"
                           "def f():\n"
                           "    from orchestrator.config import X\n"
                           "    return X\n"),
        "workers/dynamic.py": ("import importlib\n"
                               "M = importlib.import_module('orchestrator.config')\n"),
        "orchestrator/driver.py": "from workers import fine\n",
        "policies/__init__.py": "from orchestrator import config\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = {(v.file, v.line, v.imported): v.rule for v in check(tmp_path)}
    assert set(found) == {("workers/bad.py", 4, "orchestrator.config"),
                          ("workers/dynamic.py", 2, "orchestrator.config"),
                          ("orchestrator/driver.py", 1, "workers.fine"),
                          ("policies/__init__.py", 1, "orchestrator.config")}
    assert found[("workers/bad.py", 4, "orchestrator.config")].startswith("rule 1:")
    assert found[("orchestrator/driver.py", 1, "workers.fine")].startswith("rule 2:")
    text = str(Violation("workers/bad.py", 4, "orchestrator.config", "rule 1: ..."))
    assert text == "workers/bad.py:4: imports orchestrator.config: rule 1: ..."


def test_a_host_process_does_not_load_the_config_tree():
    """Every workers module imported in a fresh interpreter (what host actors, RAM holders and
    the task check run): no orchestrator module outside shared and data gets loaded."""
    modules = sorted(_module_name(p, ROOT) for p in (ROOT / "workers").rglob("*.py")
                     if p.name != "__main__.py")
    code = ("import importlib, json, sys\n"
            f"for m in {modules!r}:\n"
            "    importlib.import_module(m)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('orchestrator'))))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert "orchestrator.config" not in loaded
    assert not [m for m in loaded if _under(m, "orchestrator.controller")]
    stray = [m for m in loaded if m != "orchestrator" and not _under(m, "orchestrator.shared")
             and not _under(m, "orchestrator.data")]
    assert not stray, f"a host process loads driver modules: {stray}"
