"""`cluster.mode=emulate` submitted as a Ray job: one actionable paragraph, exit 2, no traceback.

A real local cluster from `orchestrator.cluster` (token auth on, one emulated host), a real
`ray job submit` through the job API with `--working-dir` (the case that used to die with
RuntimeEnvSetupError). Also checks that the cluster refuses a client without the token and that
`down` leaves nothing behind. Heavy (a Ray cluster): marked `cluster`.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import psutil
import pytest

from orchestrator.cluster.local import alive_hosts, down, load_state, up
from orchestrator.cluster.nodes import Shape

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]


def test_emulate_inside_a_job_fails_with_the_fix_and_token_auth_is_enforced(tmp_path):
    """FAILED with 'Configuration error ... cluster.mode=auto'; no token, no job API."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    code = tmp_path / "code"  # the committed tree, as a clone has it
    code.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(code)], input=archive, check=True)
    state_dir = tmp_path / "cluster"
    state = up(Shape(slices=1, hosts_per_slice=1, devices_per_host=1), state_dir=state_dir,
               dashboard_port=0)
    try:
        assert alive_hosts(state) == ["local-slice-0-w0"]
        token = Path(state.token_path).read_text().strip()
        assert oct(Path(state.token_path).stat().st_mode & 0o777) == "0o600"
        with pytest.raises(Exception, match=r"(?i)auth"):
            JobSubmissionClient(state.url, headers={"Authorization": "Bearer nope"}).list_jobs()
        client = JobSubmissionClient(state.url, headers={"Authorization": f"Bearer {token}"})
        job = client.submit_job(
            entrypoint=f"python -m orchestrator.main cluster.mode=emulate "
                       f"run.run_dir={tmp_path / 'run'}",
            runtime_env={"working_dir": str(code)})
        deadline = time.monotonic() + 300
        while not client.get_job_status(job).is_terminal():
            assert time.monotonic() < deadline, "the job did not end"
            time.sleep(1)
        logs = client.get_job_logs(job)
        assert client.get_job_status(job) == JobStatus.FAILED
        assert client.get_job_info(job).driver_exit_code == 2
        text = " ".join(logs.split())
        assert "Configuration error" in text and "inside a Ray job" in text
        assert "cluster.mode=auto" in text
        assert "Traceback" not in logs and "RuntimeEnvSetupError" not in logs
    finally:
        down(state_dir)
    assert load_state(state_dir) is None
    leftovers = [p for p in psutil.process_iter(["cmdline"])
                 if state.temp_dir in " ".join(p.info["cmdline"] or ())]
    assert leftovers == []
