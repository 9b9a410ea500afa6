"""Issue 53 items 3 and 4 on a real run: the examples' text LM on data shorter than the run,
output piped (as `make run | tee` or `ray job logs` get it).

The hosts' warning that the data is read several times reaches driver.log.jsonl (and stderr's
JSON records) once; stdout holds no colour code and none of Gloo's or Ray's lines, and ends
with the summary; the hosts' own output is kept in RUN_DIR/workers.log, named before the
summary. Heavy (an emulated cluster of 2 hosts): marked ``cluster``.
"""

from __future__ import annotations

import json

import pytest

from orchestrator.driver.worker_output import WORKERS_LOG
from tests.input.conftest import make_dataset
from tests.integration.cli import run_main

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

STEPS, BATCH = 30, 8


def test_a_piped_run_shows_the_hosts_warning_once_and_no_chatter(tmp_path):
    data = make_dataset(tmp_path, "bin", chars=6000)  # fewer records than the 240 rows read
    run_dir = tmp_path / "run"
    res = run_main(["--config", "examples/text_lm/config.yaml", f"run.run_dir={run_dir}",
                    f"run.total_steps={STEPS}", f"train.global_batch={BATCH}",
                    f"task.data.dir={data}", "task.vocab_size=512", "task.seq_len=16",
                    "task.d_model=32", "task.num_layers=1", "task.num_heads=2", "task.d_ff=64",
                    "cluster.emulate.hosts_per_slice=2",
                    "checkpoint.ram.enabled=false", "metrics.tensorboard=false"])
    assert res.code == 0, res.stdout[-2000:] + res.stderr[-3000:]
    records = [json.loads(ln) for ln in (run_dir / "driver.log.jsonl").read_text().splitlines()]
    warned = [r for r in records if r["message"] == "worker_warning"
              and "shorter than the run" in r["text"]]
    assert len(warned) == 1, [r for r in records if r["severity"] == "WARNING"]
    assert "shorter than the run" in res.stderr
    out = res.stdout.splitlines()
    assert "\x1b" not in res.stdout and "[gloo]" not in res.stdout.lower(), res.stdout
    assert not [ln for ln in out if "pid=" in ln or "repeated" in ln], res.stdout
    assert not [ln for ln in res.stderr.splitlines() if "pid=" in ln and not ln.startswith("{")]
    assert out[-1].startswith("  run dir:"), out[-5:]
    assert out[out.index(next(ln for ln in out if ln.startswith("Run SUCCEEDED"))) - 1] == (
        f"Workers' own output (Gloo, XLA, JAX, prints): {run_dir / WORKERS_LOG}")
    kept = (run_dir / WORKERS_LOG).read_text()
    assert "HostActor pid=" in kept and "\x1b" not in kept
    assert not res.leftovers
