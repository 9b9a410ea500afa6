"""The ``llama`` task on prepared data (issue 50 item 4): ``task.data`` (``DataSettings``) makes
it read a directory ``orchestrator.data prepare`` wrote, as ``examples/text_lm`` does, and
``examples/llama_finetune/`` (a tiny Hugging Face Llama, its tokenizer, a config) is one such
run: the config passes the driver's check against the corpus prepared with the shipped
tokenizer, a model that cannot take the data is refused naming the ``task.model`` field, and
the task trains on the data from the checkpoint (one process, no Ray)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from orchestrator.config import load_config
from orchestrator.driver.task_check import run_check
from orchestrator.shared.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "llama_finetune"
CONFIG = str(EXAMPLE / "config.yaml")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The shipped corpus prepared with the shipped tokenizer, with a held-out split."""
    out = tmp_path_factory.mktemp("corpus") / "llama"
    done = subprocess.run([sys.executable, "-m", "orchestrator.data", "prepare", "--input",
                           "examples/data", "--out", str(out), "--tokenizer",
                           str(EXAMPLE / "tokenizer.json"), "--eval-records", "64",
                           "--no-progress"], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def example(corpus: Path, *overrides: str):
    return load_config(CONFIG, [f"task.init_from={EXAMPLE}", f"task.data.dir={corpus}",
                                *overrides])


def test_the_shipped_checkpoint_fits_the_shipped_tokenizer_and_the_config():
    """config.json's vocabulary is the tokenizer's; the config pins that tokenizer's hash."""
    tok = json.loads((EXAMPLE / "tokenizer.json").read_text())
    hf = json.loads((EXAMPLE / "config.json").read_text())
    assert hf["vocab_size"] == len(tok["model"]["vocab"]) == 512
    cfg = yaml.safe_load(Path(CONFIG).read_text())
    assert cfg["task"]["model"]["vocab_size"] == hf["vocab_size"]
    want = hashlib.sha256((EXAMPLE / "tokenizer.json").read_bytes()).hexdigest()
    assert cfg["task"]["data"]["tokenizer_sha256"] == want
    assert (EXAMPLE / "model.safetensors").stat().st_size < 400_000


def test_the_example_passes_the_check_on_the_prepared_corpus(check_here, corpus):
    ok = run_check(example(corpus))
    assert ok.task["kind"] == "llama"
    assert ok.task["settings"]["data"]["dir"] == str(corpus)
    assert ok.tokens_per_step == 16 * 63
    # the data says what the steps read, not which checkpoints fit
    other = run_check(example(corpus, "task.data.shuffle=false"))
    assert other.fingerprint == ok.fingerprint


def test_a_model_that_cannot_take_the_data_is_refused_naming_the_field(check_here, corpus):
    """The data's own refusals (no checkpoint: its config.json would refuse a vocabulary
    other than 512 as well), and the run's expected tokenizer."""
    with pytest.raises(ConfigError) as info:
        run_check(example(corpus, "task.init_from=null", "task.model.vocab_size=256"))
    assert info.value.setting == "task.model.vocab_size"
    assert "vocab_size=512" in str(info.value)
    with pytest.raises(ConfigError) as info:
        run_check(example(corpus, "task.init_from=null", "task.model.seq_len=1000000"))
    assert info.value.setting == "task.model.seq_len"
    with pytest.raises(ConfigError) as info:
        run_check(example(corpus / "missing"))
    assert info.value.setting == "task.data.dir"
    with pytest.raises(ConfigError) as info:  # data of another tokenizer than the run expects
        run_check(example(corpus, "task.data.tokenizer_sha256=" + "0" * 64))
    assert info.value.setting == "task.data.tokenizer_sha256"


def test_the_llama_task_fine_tunes_on_the_prepared_corpus(corpus, tmp_path):
    """From the checkpoint, on the corpus: the first batch is the data's (its loss differs
    from the synthetic tokens'), and the loss falls; eval reads the held-out split."""
    cfg = yaml.safe_load(Path(CONFIG).read_text())["task"]
    model = [f"task.model.{k}={yaml.safe_dump(v).splitlines()[0]}"  # 1e-05: 1.0e-05
             for k, v in cfg["model"].items()]
    base = ["task.kind=llama", *model, f"task.init_from={EXAMPLE}", "train.global_batch=8",
            "train.warmup_steps=2", "train.learning_rate=3e-3", "mesh.ici.fsdp=2",
            "mesh.ici.tensor=2"]

    def losses(*extra: str) -> np.ndarray:
        out = tmp_path / f"{len(extra)}.npz"
        done = subprocess.run([sys.executable, "-m", "tests.tasks.local_run", "--devices", "4",
                               "--steps", "5", "--out", str(out), *base, *extra],
                              cwd=REPO, capture_output=True, text=True, timeout=300,
                              check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        return np.load(out)["losses"]

    real = losses(f"task.data.dir={corpus}")
    synthetic = losses()
    print(f"prepared corpus losses {real}, synthetic {synthetic}")
    assert np.all(np.isfinite(real)) and real[-1] < real[0], real
    assert real[0] != synthetic[0]
