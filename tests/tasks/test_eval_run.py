"""The one real run with eval (issue 30): ``python -m orchestrator.main`` trains the example
project (examples/text_lm) on a slice of the shipped corpus prepared with a held-out split, on the
emulated cluster (1 host, 2 CPU devices), evaluating after steps 3 and 6. The evals land in
metrics.jsonl, TensorBoard, the console and summary.json; the trained parameters (exported from
the final checkpoint) equal, bit for bit, those of the same training without eval (the same
1-process, 2-device mesh, ``tests/tasks/local_run.py``)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from orchestrator.data.prepare import PrepareConfig, prepare
from tests.input.conftest import corpus_slice
from tests.integration.cli import run_main
from tests.metrics.tfevents import read_dir, series

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
SEQ, VOCAB = 16, 512


def test_a_run_with_eval_reports_it_everywhere_and_trains_as_without(tmp_path):
    data = tmp_path / "data"
    prepare(PrepareConfig(inputs=(str(corpus_slice(tmp_path, 20_000)),), out=str(data),
                          vocab_size=VOCAB, seq_len=SEQ, shard_size=64, eval_records=16),
            progress=False)
    task = ["task.kind=examples.text_lm.task:make_task", f"task.data.dir={data}",
            f"task.vocab_size={VOCAB}", f"task.seq_len={SEQ}", "task.d_model=32",
            "task.d_ff=64", "task.num_heads=2", "train.global_batch=8", "run.total_steps=6"]
    run_dir = tmp_path / "run"
    res = run_main([*task, f"run.run_dir={run_dir}", "eval.every=3", "eval.batches=2",
                    "cluster.emulate.slices=1", "cluster.emulate.hosts_per_slice=1",
                    "cluster.emulate.devices_per_host=2", "metrics.console_every_steps=3"],
                   timeout_s=400)
    assert res.code == 0, (res.stdout + res.stderr)[-4000:]
    assert res.leftovers == ()

    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [x for x in lines if x.get("kind") == "eval"]
    assert [x["step"] for x in lines if "kind" not in x] == [1, 2, 3, 4, 5, 6]
    assert [x["step"] for x in evals] == [3, 6]
    for e in evals:
        assert math.isfinite(e["loss"]) and e["perplexity"] == pytest.approx(math.exp(e["loss"]))
        assert e["tokens"] == 2 * 8 * (SEQ - 1) and e["seconds"] > 0
    assert evals[0]["loss"] != evals[1]["loss"]
    assert "eval at step     3" in res.stdout and "eval at step     6" in res.stdout

    points = read_dir(run_dir / "tensorboard")[1]
    tb = {p.step: p.value for p in series(points, "eval/loss")}
    assert sorted(tb) == [3, 6]
    for e in evals:
        assert tb[e["step"]] == pytest.approx(e["loss"], rel=1e-6)
    assert [p.step for p in series(points, "eval/perplexity")] == [3, 6]
    assert [p.step for p in series(points, "perf/eval_time_s")] == [3, 6]

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["state"] == "SUCCEEDED"
    last = summary["last_eval"]
    assert (last["step"], last["loss"], last["batches"]) == (6, evals[1]["loss"], 2)

    from orchestrator.export import export_run

    assert export_run(run_dir, tmp_path / "export")["step"] == 6
    with np.load(tmp_path / "export" / "model.npz") as npz:
        trained = {k.removeprefix("params/"): npz[k] for k in npz.files}
    without = tmp_path / "without.npz"
    done = subprocess.run([sys.executable, "-m", "tests.tasks.local_run", "--devices", "2",
                           "--steps", "6", "--out", str(without), *task, "compile.cache=off"],
                          capture_output=True, text=True, timeout=400, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(without) as npz:
        reference = {k.removeprefix("param:"): npz[k] for k in npz.files
                     if k.startswith("param:")}
    assert sorted(trained) == sorted(reference) and len(reference) > 4
    for k, v in reference.items():
        np.testing.assert_array_equal(trained[k], v, err_msg=k)
