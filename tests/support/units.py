"""The suite's work units under pytest-xdist and how long each took in the last full run.

A unit is a test file, except for files that share a package-scoped fixture too costly to
start twice: they go to one worker as one unit (``SHARED_FIXTURE_UNITS``). tests/autoresume's
real-parts files share a token-auth Ray job server and the Pub/Sub emulator
(tests/autoresume/conftest.py); as three units, each worker that took one started both again.

``tests/durations.json`` holds each unit's seconds from a full run's junit file (``make test``
writes ``.pytest-junit.xml``; ``python -m tests.support.units .pytest-junit.xml`` rewrites the
JSON from it), so the order follows what the suite measured, not constants kept by hand.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DURATIONS = ROOT / "tests" / "durations.json"

SHARED_FIXTURE_UNITS = {
    f"tests/autoresume/{name}": "tests/autoresume (job server, emulator)"
    for name in ("test_e2e.py", "test_latency.py", "test_service_ray.py")}


def unit_of(nodeid: str) -> str:
    """The work unit of a test: its file, or its shared-fixture group."""
    path = nodeid.split("::", 1)[0]
    return SHARED_FIXTURE_UNITS.get(path, path)


def read_durations(path: Path = DURATIONS) -> dict[str, float]:
    """Unit -> seconds; empty when the file is missing or unreadable (the order is then the
    collection order, with units that start a cluster first)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    units = data.get("units") if isinstance(data, dict) else None
    if not isinstance(units, dict):
        return {}
    return {str(k): float(v) for k, v in units.items() if isinstance(v, int | float)}


def _path_of(classname: str, root: Path) -> str | None:
    """``tests.faults.test_x`` (or ``tests.faults.test_x.TestY``) -> ``tests/faults/test_x.py``."""
    parts = classname.split(".")
    for n in range(len(parts), 0, -1):
        candidate = "/".join(parts[:n]) + ".py"
        if (root / candidate).is_file():
            return candidate
    return None


def durations_from_junit(junit: Path, root: Path) -> dict[str, float]:
    """Seconds per unit: the sum of its test cases' times (setup, call and teardown, so a
    module's cluster start is counted once, on its first test)."""
    out: dict[str, float] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        path = _path_of(case.get("classname", ""), root)
        if path is None:
            continue
        unit = unit_of(path)
        out[unit] = out.get(unit, 0.0) + float(case.get("time") or 0.0)
    return {k: round(v, 1) for k, v in sorted(out.items())}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.support.units JUNIT.xml  (rewrites tests/durations.json)",
              file=sys.stderr)
        return 2
    units = durations_from_junit(Path(argv[0]), ROOT)
    if not units:
        print(f"{argv[0]} names no test of this tree: tests/durations.json left as it is",
              file=sys.stderr)
        return 1
    DURATIONS.write_text(json.dumps({"source": "a full `make test` run's junit file",
                                     "units": units}, indent=1) + "\n")
    print(f"wrote {DURATIONS} ({len(units)} units, {sum(units.values()):.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
