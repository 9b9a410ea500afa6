"""``workers.training.orbax_import``: Orbax without its Cloud Logging backend, in a fresh process
(the test environment installs ``google-cloud-logging`` through the goodput extra)."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
from workers.training.orbax_import import ocp
during = "google.cloud.logging" in sys.modules
ocp.Checkpointer  # Orbax itself is whole
import google.cloud.logging  # a later import of the package still works
print(json.dumps({"during": during, "after": "google.cloud.logging" in sys.modules,
                  "cloud_logger": hasattr(ocp.logging, "CloudLogger")}))
"""


def test_orbax_loads_without_cloud_logging_and_leaves_it_importable():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == {
        "during": False, "after": True, "cloud_logger": False}
