"""The README's "Try it locally" block, run as written (issue 16, item 1).

`make cluster` (real `ray start` head + 4 emulated TPU hosts, token auth on), `ray job submit`,
`ray job logs -f` streaming the progress, a preemption notice for host 1 through the events CLI,
the job re-forming on the spare slice and succeeding, `make cluster-down`. It runs in a fresh
export of the committed tree (what a clone gets; `--working-dir .` uploads it), sharing only the
project's virtualenv. The cluster's state goes to a temporary directory
(TPU_ORCHESTRATOR_CLUSTER_DIR) so a user's own local cluster is never touched; whatever happens,
the test stops what the block started.

Heavy (a Ray cluster and a training job on 2 cores, ~3 min): marked `cluster`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
START, END = "<!-- try-it-locally:start -->", "<!-- try-it-locally:end -->"
PROGRESS = re.compile(r"step\s+\d+ \| loss\s+[\d.]+ \| step")


def readme_block(root: Path = REPO) -> str:
    text = (root / "README.md").read_text()
    block = text[text.index(START) + len(START):text.index(END)]
    body = block.strip().removeprefix("```bash").removesuffix("```")
    assert "ray job submit" in body and "make cluster-down" in body
    return body


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def fresh_clone(dest: Path) -> Path:
    """The committed tree (git archive HEAD) with the project's .venv linked in. Its
    pyproject.toml is dated back so `make` sees the venv as installed and never reinstalls."""
    dest.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    (dest / ".venv").symlink_to(REPO / ".venv")
    os.utime(dest / "pyproject.toml", (0, 0))
    return dest


def test_readme_try_it_locally_block_runs_as_written(tmp_path):
    """Submit, watch, preempt host 1, re-form, SUCCEEDED; exactly the README's commands."""
    clone = fresh_clone(tmp_path / "clone")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RAY_") and k != "VIRTUAL_ENV"}
    env["TPU_ORCHESTRATOR_CLUSTER_DIR"] = str(tmp_path / "cluster")
    run_dir = clone / "runs" / "try-local"
    try:
        res = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", readme_block(clone)], cwd=clone,
                             env=env, capture_output=True, text=True, timeout=1100)
    finally:
        subprocess.run([sys.executable, "-m", "orchestrator.cluster", "down"], env=env,
                       cwd=clone, capture_output=True, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-6000:]
    assert PROGRESS.search(res.stdout), "no progress line in `ray job logs -f`:\n" + out[-4000:]
    assert "-> RUNNING" in res.stdout, "no state change in the job logs"
    assert "SUCCEEDED" in res.stdout
    assert "token auth on" in res.stdout
    timeline = read_jsonl(run_dir / "timeline.jsonl")
    running = [t for t in timeline if t["state"] == "RUNNING"]
    assert len({t["incarnation"] for t in running}) >= 2, "the job did not re-form"
    assert timeline[-1]["state"] == "SUCCEEDED" and timeline[-1]["step"] == 80
    events = (run_dir / "events.jsonl").read_text()
    assert "preemption" in events
    assert not (tmp_path / "cluster" / "cluster.json").exists(), "cluster-down left state"
