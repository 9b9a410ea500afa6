"""A dropped Trainer leaves no arrays or executables behind without a garbage collection: a
warm process's switch to the next group skips a full collection (~0.1-0.3 s) only then."""

from __future__ import annotations

import json
import subprocess
import sys


def test_a_closed_trainer_is_freed_by_reference_counting():
    out = subprocess.run([sys.executable, "-m", "tests.workers.trainer_release"],
                         capture_output=True, text=True, timeout=300, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["arrays_while_training"] > 0
    assert got == {**got, "trainer_alive": False, "arrays": 0, "executables": 0}, got
    # Orbax's manager is made by the first save, not with the trainer (none inside a switch)
    assert (got["manager_before_save"], got["saved"]) == (False, [2]), got
