"""run.json as the driver writes it: the run id is the run name, secrets are redacted."""

from __future__ import annotations

import json

from orchestrator.autoresume.runenv import REDACTED
from orchestrator.config import load_config
from orchestrator.main import Driver


def test_run_json_redacts_secret_env_and_uses_the_run_name_as_id(tmp_path, monkeypatch):
    """A job submitted with HF_TOKEN in its runtime_env: run.json holds <redacted>, not it."""
    job_config = {"runtime_env": {"env_vars": {"HF_TOKEN": "hf_secret", "JAX_PLATFORMS": "cpu"},
                                  "working_dir": "gcs://_ray_pkg_abc.zip"},
                  "metadata": {"job_submission_id": "llm-1-r0"}}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(job_config))
    cfg = load_config(None, ["run.name=llm-1", f"run.run_dir={tmp_path / 'run'}"])
    Driver(cfg, argv=["run.name=llm-1"])._prepare_run_dir()
    text = (tmp_path / "run" / "run.json").read_text()
    meta = json.loads(text)
    assert "hf_secret" not in text
    assert meta["runtime_env"]["env_vars"] == {"HF_TOKEN": REDACTED, "JAX_PLATFORMS": "cpu"}
    assert (meta["run_id"], meta["job"], meta["ray_job_submission_id"]) == (
        "llm-1", "llm-1", "llm-1-r0")
