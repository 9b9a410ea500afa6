"""``python -m bench`` from any directory, not only the clone's root (issue 53 item 11): the
benchmarks are part of the clone's install and find the clone's tests/ and examples/ themselves.
"""

from __future__ import annotations

import os
import subprocess
import sys


def test_bench_runs_from_another_directory(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", "import bench.autoresume_latency, bench.__main__"
                           " as m; m.parse_args(['--smoke'])"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
