"""``python -m orchestrator.export`` on a real run directory (``make_run``: a Trainer on a
2-device mesh saved Orbax steps 1-3, the RAM tier's durable store holds step 4): the export, made
in a fresh process with ONE CPU device, holds bit-identical arrays in npz and safetensors for
either tier, picks the newest complete step or ``--step``, and refuses bad input with exit 2,
the fix, and nothing written to ``--to``."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import yaml
from safetensors.numpy import load_file

from orchestrator.export import rebuild
from orchestrator.export.__main__ import main
from orchestrator.export.write import digest
from tests.export.make_run import COPIED, INCOMPLETE, UNCOMMITTED
from tests.input.conftest import SEQ_LEN, VOCAB, make_dataset

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    base = tmp_path_factory.mktemp("export-run")
    proc = subprocess.run([sys.executable, "-m", "tests.export.make_run", "--run-dir",
                           str(base / "run"), "--want", str(base / "want.npz")], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with np.load(base / "want.npz") as want:
        return base / "run", {k: want[k] for k in want.files}


@pytest.fixture(scope="module")
def text_run(tmp_path_factory) -> tuple[Path, Path]:
    """A run of examples/text_lm (a user's task: its sizes are task.* settings, the model
    section stays at the built-in lm's defaults) on prepared data, step 1 saved."""
    base = tmp_path_factory.mktemp("export-task-run")
    data = Path(make_dataset(base, "bin"))
    proc = subprocess.run([sys.executable, "-m", "tests.export.make_run", "--run-dir",
                           str(base / "run"), "--task-run",
                           "task.kind=examples.text_lm.task:make_task", f"task.data.dir={data}",
                           f"task.vocab_size={VOCAB}", f"task.seq_len={SEQ_LEN}",
                           "task.d_model=32", "task.d_ff=64", "train.global_batch=4"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return base / "run", data


def shapes(tree) -> dict[str, tuple]:
    from workers.ram.replica import leaf_name

    return {leaf_name(("params", *path)): leaf.shape
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def export(*args: str) -> subprocess.CompletedProcess:
    """The command in a fresh process: JAX's default single CPU device, not the run's mesh."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return subprocess.run([sys.executable, "-m", "orchestrator.export", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600, env=env)


def expected(want: dict[str, np.ndarray], step: int, *, opt: bool = False
             ) -> dict[str, np.ndarray]:
    tops = ("params/", "opt_state/") if opt else ("params/",)
    return {k.split(":", 1)[1]: v for k, v in want.items()
            if k.startswith(f"{step}:") and k.split(":", 1)[1].startswith(tops)}


def assert_identical(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for name, arr in want.items():
        assert got[name].dtype == arr.dtype and got[name].shape == arr.shape, name
        assert got[name].tobytes() == arr.tobytes(), f"{name} differs"


def read_export(out: Path) -> tuple[dict, dict[str, np.ndarray], dict[str, np.ndarray]]:
    manifest = json.loads((out / "export.json").read_text())
    with np.load(out / "model.npz") as npz:
        from_npz = {k: npz[k] for k in npz.files}
    return manifest, from_npz, load_file(str(out / "model.safetensors"))


def test_default_exports_the_newest_step_of_any_tier_bit_identically(made, tmp_path):
    """No --step: RAM-tier step 4 (newer than Orbax's 3), checked with ram_secret, parameters
    only; npz == safetensors == the trainer's arrays; manifest, digest and config agree."""
    run, want = made
    proc = export(str(run), "--to", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest, from_npz, from_st = read_export(tmp_path / "out")
    assert (manifest["step"], manifest["tier"]) == (COPIED, "copy")
    assert manifest["source"] == str(run / "checkpoints-from-ram" / str(COPIED))
    params = expected(want, COPIED)
    assert_identical(from_npz, params)
    assert_identical(from_st, params)
    assert "params/embed/embedding" in params and "params/block0/q/kernel" in params
    assert manifest["arrays"] == {k: {"shape": list(v.shape), "dtype": v.dtype.name}
                                  for k, v in params.items()}
    assert manifest["parameters"] == sum(v.size for v in params.values())
    assert manifest["digest"] == digest(params)
    for name, sha in manifest["files"].items():
        assert sha == "sha256:" + hashlib.sha256((tmp_path / "out" / name).read_bytes()
                                                 ).hexdigest(), name
    run_cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert yaml.safe_load((tmp_path / "out" / "config.yaml").read_text()) == {
        "task": {"kind": "lm", "settings": run_cfg["model"]}, "model": run_cfg["model"],
        "train": run_cfg["train"], "run": {"seed": 0, "total_steps": 20}}
    assert manifest["config_from"] == "config.yaml"  # a RAM-tier copy carries no run metadata
    assert manifest["tokenizer"] is None  # the lm's synthetic data has none
    _, rebuilt = rebuild(tmp_path / "out")
    assert shapes(rebuilt) == {k: v.shape for k, v in params.items()}
    assert f"exported step {COPIED} (copy tier" in proc.stdout


def test_step_selects_an_orbax_step_restored_without_the_mesh(made, tmp_path):
    """--step 2: the Orbax step saved sharded over 2 devices, restored on 1 CPU device."""
    run, want = made
    proc = export(str(run), "--step", "2", "--to", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest, from_npz, from_st = read_export(tmp_path / "out")
    assert (manifest["step"], manifest["tier"]) == (2, "orbax")
    assert_identical(from_npz, expected(want, 2))
    assert_identical(from_st, expected(want, 2))
    assert manifest["digest"] == digest(expected(want, 2)) != digest(expected(want, 3))


@pytest.mark.parametrize("step", [3, COPIED])
def test_with_opt_state_adds_the_optimizer_state(made, tmp_path, step):
    """--with-opt-state: opt_state/... too, bit-identical, from either tier."""
    run, want = made
    proc = export(str(run), "--step", str(step), "--with-opt-state", "--to",
                  str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest, from_npz, from_st = read_export(tmp_path / "out")
    full = expected(want, step, opt=True)
    assert any(k.startswith("opt_state/") for k in full)
    assert_identical(from_npz, full)
    assert_identical(from_st, full)
    assert manifest["with_opt_state"] is True


@pytest.fixture
def refused(capsys, monkeypatch):
    """Run the command in this process (these refusals come before JAX is imported)."""
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # main sets it when unset: keep pytest's env

    def run(*argv: str) -> str:
        assert main(list(argv)) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and " Fix: " in err
        return err

    return run


@pytest.mark.parametrize(("step", "says"), [
    (UNCOMMITTED, "no commit_success.txt: the save never committed"),
    (INCOMPLETE, "without COMPLETE: a source never arrived"),
    (99, "no such step directory"),
])
def test_a_step_that_is_not_complete_is_refused(made, tmp_path, refused, step, says):
    """--step of a save that never committed, an incomplete RAM-tier step, or none at all."""
    run, _ = made
    err = refused(str(run), "--step", str(step), "--to", str(tmp_path / "out"))
    assert says in err
    assert "complete steps: orbax 1, 2, 3; copy 4" in err
    assert not (tmp_path / "out").exists()


def test_a_run_with_no_complete_step_is_refused(made, tmp_path, refused):
    """Only the uncommitted step and the incomplete copy: exit 2 naming what is there."""
    run, _ = made
    bare = tmp_path / "run"
    shutil.copytree(run / "checkpoints" / str(UNCOMMITTED),
                    bare / "checkpoints" / str(UNCOMMITTED))
    shutil.copy(run / "config.yaml", bare / "config.yaml")
    err = refused(str(bare), "--to", str(tmp_path / "out"))
    assert "has no complete checkpoint step" in err
    assert f"step {UNCOMMITTED}: no commit_success.txt" in err
    assert not (tmp_path / "out").exists()


def test_an_existing_target_is_never_overwritten(made, tmp_path, refused):
    run, _ = made
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep")
    err = refused(str(run), "--to", str(tmp_path / "out"))
    assert "is not an empty directory" in err
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["mine.txt"]


def test_an_unreadable_checkpoint_exits_2_and_writes_nothing(made, tmp_path):
    """Orbax step 3 with its array data garbled: exit 2 naming --step, no --to, no temp dir."""
    run, _ = made
    broken = tmp_path / "run"
    shutil.copytree(run, broken)
    data = [p for p in (broken / "checkpoints" / "3" / "state").rglob("*")
            if p.is_file() and "/d/" in str(p)]
    assert data, "the Orbax layout changed: no array data files under state/**/d/"
    for p in data:
        p.write_bytes(b"\x00garbled" * 8)
    proc = export(str(broken), "--step", "3", "--to", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "orbax step 3" in proc.stderr and "cannot be read" in proc.stderr
    assert "--step N" in proc.stderr
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.tmp-*"))


def test_a_ram_tier_copy_needs_this_runs_secret(made, tmp_path, refused):
    """Missing ram_secret: refused naming the file; another run's secret: the HMAC check fails."""
    run, _ = made
    other = tmp_path / "run"
    shutil.copytree(run, other)
    (other / "ram_secret").unlink()
    err = refused(str(other), "--to", str(tmp_path / "out"))
    assert "ram_secret" in err and "cannot be read" in err
    (other / "ram_secret").write_text("f" * 64 + "\n")
    os.chmod(other / "ram_secret", 0o600)  # private, as the driver writes it: read, then refused
    proc = export(str(other), "--to", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "fails its authentication" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_user_tasks_export_describes_its_model_rebuilds_it_and_carries_the_tokenizer(
        text_run, tmp_path):
    """Issue 53: the exported config.yaml has no `model` section of the built-in lm's defaults
    (vocab 128, d_model 64); it names the task and its settings as they ran, the model built
    from it has the exported shapes, and the data's tokenizer lies beside the weights."""
    run, data = text_run
    proc = export(str(run), "--to", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "out"
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert "model" not in config, config
    assert config["task"]["kind"] == "examples.text_lm.task:make_task"
    settings = config["task"]["settings"]
    assert (settings["vocab_size"], settings["d_model"], settings["seq_len"]) == (VOCAB, 32,
                                                                                SEQ_LEN)
    assert settings["num_layers"] == 2  # a default filled in: the settings as they ran
    assert config["train"]["global_batch"] == 4 and config["run"]["seed"] == 0

    manifest, from_npz, _ = read_export(out)
    assert manifest["config_from"] == "checkpoint"
    task, params = rebuild(out)
    assert task.ref.kind == "examples.text_lm.task:make_task"
    assert shapes(params) == {k: v.shape for k, v in from_npz.items()}
    assert from_npz["params/embed/embedding"].shape == (VOCAB, 32)
    loss, _ = task.task.loss(params, np.zeros((2, SEQ_LEN), np.int32))
    assert np.isfinite(float(loss))

    tok = manifest["tokenizer"]
    assert tok["file"] == "tokenizer.json" and tok["vocab_size"] <= VOCAB
    assert (out / "tokenizer.json").read_bytes() == (data / "tokenizer.json").read_bytes()
    assert manifest["files"]["tokenizer.json"] == "sha256:" + tok["sha256"]
    assert "tokenizer" in proc.stdout and "copied as tokenizer.json" in proc.stdout


def test_a_rebuild_that_does_not_fit_the_weights_is_refused(text_run, tmp_path):
    run, _ = text_run
    assert export(str(run), "--to", str(tmp_path / "out")).returncode == 0
    path = tmp_path / "out" / "config.yaml"
    path.write_text(path.read_text().replace("d_model: 32", "d_model: 16"))
    from orchestrator.export import ExportError

    with pytest.raises(ExportError, match="does not fit the exported weights") as info:
        rebuild(tmp_path / "out")
    assert "params/block0/down/kernel: exported (64, 32) float32, built (64, 16)" in str(
        info.value)


def test_a_tokenizer_that_cannot_be_read_now_is_said_and_fails_nothing(tmp_path):
    """The data moved since the run: export.json says why the tokenizer is not there."""
    from orchestrator.export.write import _tokenizer

    data, info = _tokenizer({"kind": "a.b:c", "settings": {"data": {"dir": str(tmp_path)}}})
    assert data is None and info["tokenizer"] is None
    assert "task.data.dir" in info["tokenizer_missing"] and "manifest.json" in \
        info["tokenizer_missing"]
    assert _tokenizer({"kind": "a.b:c", "settings": {"hidden": 3}}) == (None, {"tokenizer": None})
