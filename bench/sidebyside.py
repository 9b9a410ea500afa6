"""Systems run side by side: every repeat runs each system once, one after another on the same
machine (interleaved, so load drift hits every system), each started on an idle machine, with
the load before and after recorded; the result is one JSON in ``bench/results``."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench import machine


def wait_for_idle(max_wait_s: float = 240.0) -> None:
    """The previous run's processes leave the 1-minute load up for a while: wait (bounded)
    until it is below the validity threshold, so each run starts on an idle machine."""
    deadline = time.monotonic() + max_wait_s
    while time.monotonic() < deadline:
        load = machine.load_average()
        if load is None or load[0] < machine.IDLE_LOAD_1MIN - 0.3:
            return
        time.sleep(5)


def interleave(name: str, systems: Sequence[str], repeats: int,
               measure: Callable[[str, Path], dict], line: Callable[[dict], str]
               ) -> tuple[list[dict], list[dict], float]:
    """(runs, loads, started): ``measure(system, run_dir)`` for every repeat and system, in a
    fresh scratch directory; each run gets its ``repeat`` and ``line(run)`` is printed."""
    scratch = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    print(f"scratch: {scratch}", flush=True)
    runs, loads = [], []
    started = time.time()
    for repeat in range(repeats):
        for system in systems:
            wait_for_idle()
            out = measure(system, scratch / f"{repeat}-{system.replace('+', '-')}")
            out["repeat"] = repeat
            runs.append(out)
            loads.append({"measurement": f"{repeat}/{system}", "before": out["load_before"],
                          "after": out["load_after"]})
            print(f"  {repeat}/{system}: {line(out)} (load {out['load_before']})", flush=True)
    return runs, loads, started


def write_result(name: str, out: str, result: dict) -> Path:
    """``<out>/<name>-<UTC time>.json``."""
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps(result, indent=1, default=str))
    return path
