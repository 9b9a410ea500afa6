"""Benchmarks: orchestration overhead, recovery time and goodput, measured side by side.

``python -m bench --help``. Each figure is a ratio or a count measured in one run on the local CPU
Ray cluster; results go to ``bench/results/*.json`` and a printed table (see bench/README.md).
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The clone the benchmarks come from: they run the clone's ``tests/`` support and
``examples/`` tasks, so those resolve from any working directory, not just the clone's root."""

if not (ROOT / "tests").is_dir() or not (ROOT / "examples").is_dir():
    raise ImportError(f"bench runs from a clone of the repository (it uses the clone's tests/ and "
                      f"examples/, not found beside {Path(__file__).parent}): install the clone "
                      "with `pip install -e .` and run `python -m bench ...` again")
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
