"""The head pod's preStop hook SIGTERMs this user's drivers and waits for them to exit."""

from __future__ import annotations

import subprocess
import sys
import uuid

from orchestrator.driver import prestop

DRAINS = """
import signal, sys, time
def term(*_):
    time.sleep(0.5)  # the drain: one step and a save
    sys.exit(143)
signal.signal(signal.SIGTERM, term)
print("up", flush=True)
time.sleep(60)
"""


def _driver(module: str) -> subprocess.Popen:
    """A process whose argv reads ``... -m <module>``, as ``python -m <module>`` does."""
    proc = subprocess.Popen([sys.executable, "-c", DRAINS, "-m", module],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    return proc


def test_prestop_sigterms_the_drivers_and_waits_for_their_drain(capsys):
    module = f"tpu_orch_prestop_test_{uuid.uuid4().hex}"  # never another test's real driver
    procs = [_driver(module), _driver(module)]
    try:
        assert prestop.drivers(module) == sorted(p.pid for p in procs)
        assert prestop.main(["--module", module, "--wait-s", "20"]) == 0
        assert [p.wait(5) for p in procs] == [143, 143]  # drained, not killed
        out = capsys.readouterr().out
        assert all(f"SIGTERM sent to driver {p.pid}" in out for p in procs)
        assert "still running" not in out
    finally:
        for p in procs:
            p.kill()
            p.wait(5)


def test_prestop_names_a_driver_that_outlives_its_wait(capsys):
    module = f"tpu_orch_prestop_test_{uuid.uuid4().hex}"
    proc = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                             "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', "
                             "flush=True); time.sleep(60)", "-m", module],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "up"
        assert prestop.main(["--module", module, "--wait-s", "1"]) == 0
        out = capsys.readouterr().out
        assert f"[{proc.pid}] still running after 1s" in out
        assert "terminationGracePeriodSeconds" in out
    finally:
        proc.kill()
        proc.wait(5)
