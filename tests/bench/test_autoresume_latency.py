"""bench/autoresume_latency.py runs against today's autoresume: token auth, allowed entrypoint."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.pubsub_emulator import gcloud_available

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.cluster
@pytest.mark.emulator
@pytest.mark.skipif(not gcloud_available(), reason="needs gcloud (Pub/Sub emulator)")
@pytest.mark.timeout(900)
def test_one_repeat_measures_publish_to_running() -> None:
    """`--repeats 1` exits 0 and prints the repeat's three numbers and the medians."""
    proc = subprocess.run([sys.executable, "bench/autoresume_latency.py", "--repeats", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=840)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"repeat 0: alert publish -> job RUNNING [\d.]+s \(publish -> submitted "
                     r"[\d.]+s, submitted -> RUNNING -?[\d.]+s\)", proc.stdout), proc.stdout
    assert re.search(r"^median [\d.]+s over 1 ", proc.stdout, re.MULTILINE), proc.stdout
