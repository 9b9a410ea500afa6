"""docs/CONTRACTS.md names every call the driver can make on a host and every lifecycle state.

Read by introspection, no Ray and no JAX (importing the host actor's module starts neither): each
public method of ``HostActor`` (what ``ray.remote`` exposes to the driver) has a row of the "Host
actor" table whose first cell names it as a call, ``name(``, and that row names each of its
parameters; each ``RunState`` is in "Lifecycle states".
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from orchestrator.lifecycle import RunState
from workers.host.actor import HostActor

CONTRACTS = Path(__file__).resolve().parent.parent / "docs" / "CONTRACTS.md"


def section(title: str, text: str | None = None) -> str:
    text = CONTRACTS.read_text(encoding="utf-8") if text is None else text
    assert f"\n## {title}" in text, f"docs/CONTRACTS.md has no section '## {title}'"
    return text.split(f"\n## {title}", 1)[1].split("\n## ", 1)[0]


def host_methods() -> dict[str, list[str]]:
    """Public method -> its parameter names (without ``self``, and without the
    ``_ray_trace_ctx`` Ray adds in place once ``ray.remote`` has wrapped the class in this
    process, as an earlier test of the same worker may have)."""
    return {name: [p for p in inspect.signature(fn).parameters
                   if p != "self" and not p.startswith("_")]
            for name, fn in vars(HostActor).items()
            if not name.startswith("_") and inspect.isfunction(fn)}


def undocumented(methods: dict[str, list[str]], doc: str) -> list[str]:
    """What the table leaves out: a method with no row whose first cell names it as
    ``name(``, or a parameter its rows do not name."""
    rows = [line for line in doc.splitlines() if line.startswith("| ")]
    out = []
    for name, params in sorted(methods.items()):
        mine = [row for row in rows if re.search(rf"`{name}\(", row.split(" | ", 1)[0])]
        if not mine:
            out.append(f"{name}: no row of the Host actor table names `{name}(...)`")
            continue
        out += [f"{name}: parameter {p!r} is not in its row" for p in params
                if not any(re.search(rf"\b{p}\b", row) for row in mine)]
    return out


def test_every_host_actor_call_and_parameter_is_documented():
    missing = undocumented(host_methods(), section("Host actor"))
    assert not missing, "docs/CONTRACTS.md, Host actor:\n" + "\n".join(missing)


def test_every_lifecycle_state_is_documented():
    doc = section("Lifecycle states")
    missing = [s.value for s in RunState if not re.search(rf"\b{s.value}\b", doc)]
    assert not missing, f"docs/CONTRACTS.md, Lifecycle states, lacks {missing}"


def test_the_checker_names_a_missing_call_and_parameter():
    doc = "| `a(x)` / `b()` | ... |\n| `c(y)` | also `d()` |\n"
    assert undocumented({"a": ["x"], "b": [], "c": ["y", "z"], "d": []}, doc) == [
        "c: parameter 'z' is not in its row",
        "d: no row of the Host actor table names `d(...)`",
    ]
