"""``python -m orchestrator.export RUN_DIR --format hf``: a llama run as a Hugging Face
LlamaForCausalLM directory (``orchestrator/export/hf.py``), and the tensor round trip against the
goldens (``tests/goldens/llama``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import yaml
from safetensors import safe_open
from safetensors.numpy import load_file

from orchestrator.export.read import read
from orchestrator.export.select import choose
from workers.models import hf_llama
from workers.models.llama import LlamaConfig

REPO = Path(__file__).resolve().parents[2]
GOLDENS = REPO / "tests" / "goldens" / "llama"
MODEL = ["task.preset=tiny", "task.model.vocab_size=128", "task.model.d_model=32",
         "task.model.d_ff=96", "task.model.seq_len=16"]


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory) -> Path:
    """A real llama run (the tiny preset at the goldens' sizes): one step trained and saved."""
    base = tmp_path_factory.mktemp("export-llama-run")
    proc = subprocess.run([sys.executable, "-m", "tests.export.make_run", "--run-dir",
                           str(base / "run"), "--task-run", "task.kind=llama", *MODEL,
                           "train.global_batch=4"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return base / "run"


def export(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return subprocess.run([sys.executable, "-m", "orchestrator.export", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600, env=env)


def run_params(run: Path) -> tuple[LlamaConfig, dict]:
    """The run's model and its newest step's parameters, read as the native export reads."""
    task = yaml.safe_load((run / "config.yaml").read_text())["task"]
    arrays, _ = read(choose(run), run, with_opt_state=False)
    tree: dict = {}
    for name, arr in arrays.items():
        *parents, leaf = name.split("/")[1:]
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = arr
    return hf_llama.config_of_task(task["settings"]), tree


def hf_dir_tensors(d: Path) -> dict[str, np.ndarray]:
    ckpt = hf_llama.Checkpoint(d)
    return {name: ckpt.read(name) for name in ckpt.where}


@pytest.mark.parametrize("scan", [True, False])
@pytest.mark.parametrize("case", ["gqa_untied", "mha_tied", "mqa_tied"])
def test_golden_to_tree_to_hf_gives_back_the_same_tensors_bit_for_bit(case, scan):
    d = GOLDENS / case
    cfg = LlamaConfig(**hf_llama.config_from_hf(hf_llama.read_config(d)), scan_layers=scan)
    want = load_file(str(d / "model.safetensors"))
    got = dict(hf_llama.hf_tensors(hf_llama.load_tree(d, cfg), cfg))
    assert list(got) == [t.hf for t in hf_llama.tensors(cfg)]
    assert sorted(got) == sorted(want)
    for name, arr in want.items():
        assert got[name].dtype == arr.dtype and got[name].tobytes() == arr.tobytes(), name


def test_a_llama_run_exports_as_a_hugging_face_directory(llama_run, tmp_path):
    """config.json describes the run's model; the weights are the step's, renamed and
    transposed, bit for bit, in one model.safetensors that safetensors itself reads."""
    proc = export(str(llama_run), "--format", "hf", "--to", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "export.json",
                                                      "model.safetensors"]
    cfg, params = run_params(llama_run)
    hf = json.loads((out / "config.json").read_text())
    assert hf["architectures"] == ["LlamaForCausalLM"] and hf["torch_dtype"] == "float32"
    assert hf_llama.config_from_hf(hf) == {f: getattr(cfg, f) for f in hf_llama.HF_FIELD}
    want = dict(hf_llama.hf_tensors(params, cfg))
    got = load_file(str(out / "model.safetensors"))
    assert sorted(got) == sorted(want)
    for name, arr in want.items():
        assert got[name].dtype == np.float32 and got[name].tobytes() == arr.tobytes(), name
    with safe_open(str(out / "model.safetensors"), framework="np") as f:
        assert f.metadata()["format"] == "pt"  # transformers refuses a file without it
    manifest = json.loads((out / "export.json").read_text())
    assert (manifest["format"], manifest["step"], manifest["dtype"]) == ("hf", 1, "float32")
    assert "Hugging Face LlamaForCausalLM" in proc.stdout


def test_bf16_sharded_above_the_size_with_an_index(llama_run, tmp_path):
    """--dtype bf16 rounds each float32 weight to nearest even; --shard-size splits the files
    (none above the size unless one tensor is) and the index maps every tensor to its file."""
    proc = export(str(llama_run), "--format", "hf", "--to", str(tmp_path / "out"), "--dtype",
                  "bf16", "--shard-size", "30KB")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "out"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert files == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert not (out / "model.safetensors").exists()
    cfg, params = run_params(llama_run)
    want = dict(hf_llama.hf_tensors(params, cfg))
    got = hf_dir_tensors(out)
    assert sorted(got) == sorted(want)
    for name, arr in want.items():
        assert got[name].dtype == ml_dtypes.bfloat16, name
        assert got[name].tobytes() == arr.astype(ml_dtypes.bfloat16).tobytes(), name
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in got.values())
    for f in files:
        names = [n for n, file in index["weight_map"].items() if file == f]
        size = sum(got[n].nbytes for n in names)
        assert size <= 30_000 or len(names) == 1
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_a_run_of_another_task_is_refused_with_exit_2_naming_the_fix(llama_run, tmp_path):
    """A step whose run metadata names the lm task: nothing written, the native format named."""
    run = tmp_path / "run"
    shutil.copytree(llama_run, run)
    meta_path = run / "checkpoints" / "1" / "meta" / "metadata"
    meta = json.loads(meta_path.read_text())
    meta["task"] = {"kind": "lm", "settings": {}}
    meta_path.write_text(json.dumps(meta))
    proc = export(str(run), "--format", "hf", "--to", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "ran task.kind 'lm'" in proc.stderr and "without --format hf" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args,says", [
    (["--dtype", "bf16"], "apply to --format hf only"),
    (["--format", "hf", "--with-opt-state"], "native format only"),
    (["--format", "hf", "--shard-size", "lots"], "is not a size"),
])
def test_flags_that_do_not_go_together_exit_2(args, says, tmp_path):
    proc = export(str(tmp_path), "--to", str(tmp_path / "out"), *args)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr[-2000:]
