"""``python -m orchestrator.driver.prestop [--wait-s S]``: the Ray head pod's preStop hook.

Kubernetes sends SIGTERM to a deleted pod's PID 1 only; on a KubeRay head that is the shell
running ``ray start --block``, which passes nothing on, so the drivers it runs (Ray jobs) would
be SIGKILLed at the end of ``terminationGracePeriodSeconds`` with their steps since the last
save lost. This hook sends SIGTERM to every ``python -m orchestrator.main`` of this user on the
pod and waits (at most ``--wait-s``) for them to exit: each drains, saves the step it stopped
at and exits 143 (``orchestrator/driver/signals.py``), a status autoresume resubmits once the
cluster is back. The hook's time counts against the grace period: keep ``--wait-s`` below it.
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from orchestrator.shared.procfs import stat_fields

MODULE = "orchestrator.main"


def drivers(module: str = MODULE, proc: Path = Path("/proc")) -> list[int]:
    """Pids of this user's processes started as ``python -m <module>`` (not this one)."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if entry.stat().st_uid != os.getuid():
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if any(a == b"-m" and b == module.encode() for a, b in itertools.pairwise(argv)):
            found.append(int(entry.name))
    return sorted(found)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = stat_fields(pid)  # a zombie (exited, not yet reaped) has drained already
    return fields is not None and fields[0] != "Z"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrator.driver.prestop",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--wait-s", type=float, default=170.0,
                   help="wait at most this long for the drivers to exit (below the pod's "
                        "terminationGracePeriodSeconds)")
    p.add_argument("--module", default=MODULE, help=argparse.SUPPRESS)  # tests
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    pids = drivers(args.module)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
            print(f"prestop: SIGTERM sent to driver {pid}", flush=True)
        except OSError as exc:
            print(f"prestop: cannot signal driver {pid}: {exc}", flush=True)
    deadline = time.monotonic() + args.wait_s
    while (left := [pid for pid in pids if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    if left:
        print(f"prestop: driver(s) {left} still running after {args.wait_s:g}s; Kubernetes "
              "kills them at the end of the grace period. Fix: raise the pod's "
              "terminationGracePeriodSeconds and --wait-s", flush=True)
    return 0  # the pod goes either way


if __name__ == "__main__":
    sys.exit(main())
