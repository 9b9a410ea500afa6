"""README "Train your own model": the example project's block, run as written (issue 30 item 6,
issue 31).

In a fresh export of the committed tree (what a clone gets; only the project's virtualenv is
shared, linked in as `make` would have created it), the block prepares the shipped corpus,
starts the local TPU-like cluster (real `ray start` processes on 127.0.0.1, token auth on),
submits `examples/text_lm` with `ray job submit --working-dir .`, sends a preemption notice for
host 1 through the events CLI, streams the job's logs, prints summary.json and stops the
cluster. A user's shell differs from the test's in one way: HOME is a temporary directory (the
cluster's state and token, the executables key), so nothing of the machine's own is touched.

Before the block's last command (cluster down) the test checks what Ray unpacked for the job:
the package holds `examples/text_lm` and none of `.venv/` or `runs/` (`.gitignore`). Whatever
happens, the cluster is stopped. Heavy (one cluster, a short training job): marked `cluster`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.production.test_try_locally import fresh_clone, read_jsonl

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
START, END = "<!-- train-your-own-model:start -->", "<!-- train-your-own-model:end -->"
FIRST, LAST = "source .venv/bin/activate", "python -m orchestrator.cluster down"
PROGRESS = re.compile(r"step\s+\d+ \| loss\s+[\d.]+ \| step")


def readme_block(root: Path = REPO) -> tuple[str, str]:
    """The block without its last command, and that command (cluster down) in the same shell
    state: after the block's first line, which activates the virtualenv."""
    text = (root / "README.md").read_text()
    assert text.count(START) == 1 and text.count(END) == 1
    body = text[text.index(START) + len(START):text.index(END)].strip()
    assert body.startswith("```bash") and body.endswith("```")
    lines = body.removeprefix("```bash").removesuffix("```").strip().splitlines()
    assert lines[0].strip() == FIRST and lines[-1].strip() == LAST, (lines[0], lines[-1])
    return "\n".join(lines[:-1]) + "\n", f"{lines[0]}\n{lines[-1]}\n"


def user_env(home: Path) -> dict[str, str]:
    """The test's environment as a new user's shell: no Ray client settings, no virtualenv
    active, none of the suite's orchestrator settings; a home of its own."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_", "TPU_ORCH")) and k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    home.mkdir()
    env["HOME"] = str(home)
    return env


def unpacked_packages(temp_dir: str) -> list[Path]:
    """The working_dir packages Ray unpacked on this machine's nodes for the job."""
    return [p for p in Path(temp_dir).glob("**/runtime_resources/working_dir_files/_ray_pkg_*")
            if p.is_dir()]


def test_readme_train_your_own_model_block_runs_as_written(tmp_path):
    """prepare -> cluster up -> ray job submit --working-dir . -> preemption -> SUCCEEDED."""
    from orchestrator.cluster.local import load_state

    clone = fresh_clone(tmp_path / "clone")
    home = tmp_path / "home"
    env = user_env(home)
    state_dir = home / ".tpu-orchestrator" / "local-cluster"
    block, last = readme_block(clone)
    steps = int(re.search(r"run\.total_steps=(\d+)", block).group(1))
    run_dir = clone / "runs" / "text-lm-job"
    temp_dir = None
    try:
        res = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block], cwd=clone,
                             env=env, capture_output=True, text=True, timeout=1100)
        assert res.returncode == 0, (res.stdout + res.stderr)[-6000:]
        state = load_state(state_dir)
        assert state is not None and state.auth
        temp_dir = state.temp_dir
        packages = unpacked_packages(temp_dir)
        assert packages, "Ray unpacked no working_dir package"
        for pkg in packages:
            assert (pkg / "examples" / "text_lm" / "task.py").is_file()
            assert not (pkg / ".venv").exists() and not (pkg / "runs").exists(), pkg
        down = subprocess.run(["bash", "-e", "-c", last], cwd=clone, env=env,
                              capture_output=True, text=True, timeout=300)
        assert down.returncode == 0, (down.stdout + down.stderr)[-3000:]
    finally:
        subprocess.run([sys.executable, "-m", "orchestrator.cluster", "down"], env=env,
                       cwd=clone, capture_output=True, timeout=120)
    out = res.stdout + res.stderr
    assert "prepared " in out and "token auth on" in out
    assert PROGRESS.search(res.stdout), "no progress line in `ray job logs -f`:\n" + out[-4000:]
    assert "Run SUCCEEDED" in res.stdout and "Job 'text-lm-r0' succeeded" in out

    data_dir = clone / "runs" / "data" / "sqlite"
    assert (data_dir / "manifest.json").is_file()
    import yaml

    recorded = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert recorded["task"]["kind"] == "examples.text_lm.task:make_task"
    assert recorded["task"]["settings"]["data"]["dir"] == str(data_dir)

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["state"] == "SUCCEEDED" and summary["step"] == steps
    assert summary["restarts"].get("spot_preemption", 0) >= 1, summary["restarts"]
    assert summary["lost_steps"] == 0
    assert summary["last_loss"] < summary["first_loss"]
    line = str({"state": "SUCCEEDED", "step": steps, "restarts": summary["restarts"],
                "lost_steps": 0})
    assert line in res.stdout, res.stdout[-3000:]
    running = [t for t in read_jsonl(run_dir / "timeline.jsonl") if t["state"] == "RUNNING"]
    assert len({t["incarnation"] for t in running}) >= 2, "the job did not re-form"
    assert "preemption" in (run_dir / "events.jsonl").read_text()

    assert not (state_dir / "cluster.json").exists(), "cluster down left state"
    leftovers = [p for p in psutil.process_iter(["cmdline"])
                 if temp_dir in " ".join(p.info["cmdline"] or ())]
    assert leftovers == [], "cluster down left processes"
