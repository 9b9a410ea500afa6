"""The README's "Try it locally" block, run as written (issue 16, item 1).

`make cluster` (real `ray start` head + 4 emulated TPU hosts, token auth on), `ray job submit`,
`ray job logs -f` streaming the progress, a preemption notice for host 1 through the events CLI,
the job re-forming on the spare slice and succeeding, `make cluster-down`. It runs in a fresh
export of the committed tree (what a clone gets; `--working-dir .` uploads it), sharing only the
project's virtualenv. The cluster's state goes to a temporary directory
(TPU_ORCHESTRATOR_CLUSTER_DIR) so a user's own local cluster is never touched; whatever happens,
the test stops what the block started.

Before the block's last command (`make cluster-down`), while its cluster is still up, the test
also checks the two ways that cluster must refuse misuse: a client without the token gets no job
API, and `cluster.mode=emulate` submitted as a job fails at once with exit 2 and one actionable
paragraph (no traceback, no RuntimeEnvSetupError); and that a slice can vanish and a new one join
(the standing-cluster bench's cloud). After `make cluster-down`, no process of the cluster is
left, the new slice's included.

Heavy (a Ray cluster and a training job on 2 cores, ~3 min): marked `cluster`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
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


def split_last_command(block: str) -> tuple[str, str]:
    """The block without its last command, and that command (`make cluster-down`)."""
    lines = block.strip().splitlines()
    assert lines[-1].strip() == "make cluster-down", lines[-1]
    return "\n".join(lines[:-1]) + "\n", lines[-1] + "\n"


def check_misuse_is_refused(state_dir: Path, code: Path, run_dir: Path) -> str:
    """On the block's cluster: no token, no job API; `cluster.mode=emulate` as a job -> FAILED,
    exit 2, the fix named. Returns the cluster's Ray temp dir (for the leftover check)."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    from orchestrator.cluster.local import load_state

    state = load_state(state_dir)
    assert state is not None and state.auth
    assert oct(Path(state.token_path).stat().st_mode & 0o777) == "0o600"
    with pytest.raises(Exception, match=r"(?i)auth"):
        JobSubmissionClient(state.url, headers={"Authorization": "Bearer nope"}).list_jobs()
    token = Path(state.token_path).read_text().strip()
    client = JobSubmissionClient(state.url, headers={"Authorization": f"Bearer {token}"})
    job = client.submit_job(
        entrypoint=f"python -m orchestrator.main cluster.mode=emulate run.run_dir={run_dir}",
        runtime_env={"working_dir": str(code)})
    deadline = time.monotonic() + 300
    while not client.get_job_status(job).is_terminal():
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(1)
    logs = client.get_job_logs(job)
    assert client.get_job_status(job) == JobStatus.FAILED, logs[-3000:]
    assert client.get_job_info(job).driver_exit_code == 2
    text = " ".join(logs.split())
    assert "Configuration error" in text and "inside a Ray job" in text
    assert "cluster.mode=auto" in text
    assert "Traceback" not in logs and "RuntimeEnvSetupError" not in logs
    return state.temp_dir


def swap_slices(state_dir: Path) -> None:
    """The standing cluster's cloud (``bench.standing``): a slice's hosts vanish at once, a new
    slice of the same shape joins (``check_slices_swapped`` sees the result)."""
    from orchestrator.cluster import local

    assert sorted(local.slice_nodes(local.load_state(state_dir))) == [
        "local-slice-0", "local-slice-1"]
    assert local.remove_slice("local-slice-1", state_dir=state_dir) == [
        "local-slice-1-w0", "local-slice-1-w1"]
    local.add_slice("local-slice-2", state_dir=state_dir)


def check_slices_swapped(state_dir: Path) -> None:
    """After ``swap_slices``: the vanished slice's nodes are gone from Ray, the new slice is
    there, a name already used is refused; ``down`` stops them all."""
    from orchestrator.cluster import local

    deadline = time.monotonic() + 60  # the GCS marks a SIGKILLed node dead after its checks
    while "local-slice-1" in (now := local.slice_nodes(local.load_state(state_dir))):
        assert time.monotonic() < deadline, now
        time.sleep(1)
    assert sorted(now) == ["local-slice-0", "local-slice-2"]
    assert [h["instance"] for h in now["local-slice-2"]] == ["local-slice-2-w0",
                                                             "local-slice-2-w1"]
    with pytest.raises(local.LocalClusterError, match="already part"):
        local.add_slice("local-slice-0", state_dir=state_dir)


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
    block, last = split_last_command(readme_block(clone))
    temp_dir = None
    try:
        res = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block], cwd=clone,
                             env=env, capture_output=True, text=True, timeout=1100)
        assert res.returncode == 0, (res.stdout + res.stderr)[-6000:]
        swap_slices(tmp_path / "cluster")  # the GCS needs ~15 s to see the nodes gone: the
        # job refused meanwhile fills that wait
        temp_dir = check_misuse_is_refused(tmp_path / "cluster", clone, tmp_path / "misuse")
        check_slices_swapped(tmp_path / "cluster")
        down = subprocess.run(["bash", "-e", "-c", last], cwd=clone, env=env,
                              capture_output=True, text=True, timeout=300)
        assert down.returncode == 0, (down.stdout + down.stderr)[-3000:]
    finally:
        subprocess.run([sys.executable, "-m", "orchestrator.cluster", "down"], env=env,
                       cwd=clone, capture_output=True, timeout=120)
    out = res.stdout + res.stderr
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
    leftovers = [p for p in psutil.process_iter(["cmdline"])
                 if temp_dir in " ".join(p.info["cmdline"] or ())]
    assert leftovers == [], "make cluster-down left processes"
