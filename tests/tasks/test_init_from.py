"""``task.init_from`` of the ``llama`` task: a new run starts from a Hugging Face directory
(docs/hf.md, "Import"). Refusals come from the driver's task check (in this process); the run
itself from ``tests.tasks.init_from_run`` in a subprocess with 4 CPU devices."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from orchestrator.config import load_config
from orchestrator.driver.task_check import run_check
from orchestrator.shared.errors import ConfigError
from tests.tasks.golden_llama import GOLDEN, MODEL
from workers.models import hf_llama
from workers.models.llama import LlamaConfig

LLAMA = ("task.kind=llama", "task.preset=tiny", *MODEL)
LOSS_TOLERANCE = 1e-5
"""|Δ loss| against transformers' reference loss, float32 (docs/hf.md, "Parity")."""


def check(init_from, *more: str, resuming: bool = False):
    return run_check(load_config(None, [*LLAMA, f"task.init_from={init_from}", *more]),
                     resuming=resuming)


def test_a_new_run_from_a_golden_trains_its_first_step_at_the_reference_loss(tmp_path):
    """Placed straight into sharded arrays (fsdp=2 × tensor=2), the parameters are the
    checkpoint's bit for bit; the first step's loss on the golden's inputs is transformers';
    a restore from the run's committed step reads no Hugging Face file (the directory is
    gone by then), and a new run without the directory is refused naming task.init_from."""
    done = subprocess.run([sys.executable, "-m", "tests.tasks.init_from_run",
                           "--work", str(tmp_path)], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    with np.load(GOLDEN / "reference.npz") as ref:
        reference = float(ref["loss"])
    print(f"first step loss {out['first_loss']!r}, reference {reference!r}")
    assert out["fresh_restore_step"] is None
    assert out["placed_keys_equal"] and out["placed_bit_equal"]
    assert out["reads"] == out["distinct_slices"] < out["device_slices"]  # shared: read once
    assert any("tensor" in s for s in out["shardings"]), out["shardings"]  # really sharded
    assert abs(out["first_loss"] - reference) <= LOSS_TOLERANCE
    assert out["resumed_step"] == 1 and out["resumed_equal"]
    assert out["new_run_error"]["setting"] == "task.init_from"
    assert "is not a directory" in out["new_run_error"]["message"]


def test_a_checkpoint_of_another_model_is_refused_naming_the_field_and_value(check_here):
    with pytest.raises(ConfigError) as info:
        run_check(load_config(None, [*LLAMA, "task.model.d_ff=128",
                                     f"task.init_from={GOLDEN}"]))
    assert info.value.setting == "task.model.d_ff"
    assert "intermediate_size" in str(info.value) and "task.model.d_ff=96" in info.value.fix


def test_a_missing_or_incomplete_directory_is_refused_naming_init_from(check_here, tmp_path):
    with pytest.raises(ConfigError) as info:
        check(tmp_path / "nowhere")
    assert info.value.setting == "task.init_from" and "nowhere is not a directory" in str(
        info.value) and "task.init_from" in info.value.fix
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError) as info:
        check(empty)
    assert info.value.setting == "task.init_from" and "has no config.json" in str(info.value)
    shutil.copy(GOLDEN / "config.json", empty / "config.json")
    with pytest.raises(ConfigError) as info:
        check(empty)
    assert info.value.setting == "task.init_from" and "neither model.safetensors" in str(
        info.value)


def test_the_check_passes_counts_the_load_and_skips_it_when_resuming(check_here, tmp_path):
    """A good directory passes and its load is counted in host memory; a run that resumes a
    committed step neither checks nor counts it (the directory may be gone)."""
    ok = check(GOLDEN)
    assert ok.task["settings"]["init_from"] == str(GOLDEN)
    assert ok.memory["load_bytes"] > 0
    resumed = check(tmp_path / "gone", resuming=True)
    assert resumed.memory["load_bytes"] == 0
    assert resumed.fingerprint == ok.fingerprint  # where a run starts is not which model


@pytest.mark.parametrize("scan", [True, False])
def test_a_devices_slice_is_the_whole_trees_slice(scan):
    """``read_leaf`` of any slice (what one device owns) equals that slice of the whole tree,
    stacked layers and unrolled alike."""
    hf = json.loads((GOLDEN / "config.json").read_text())
    cfg = LlamaConfig(**{**hf_llama.config_from_hf(hf), "seq_len": 16, "scan_layers": scan})
    whole = hf_llama.load_tree(GOLDEN, cfg)
    ckpt = hf_llama.Checkpoint(GOLDEN)
    rng = np.random.default_rng(0)
    for path, leaf in hf_llama.leaf_tensors(cfg).items():
        node = whole
        for key in path:
            node = node[key]
        for _ in range(3):
            index = tuple(slice(a, rng.integers(a + 1, n + 1))
                          for n in node.shape for a in [int(rng.integers(0, n))])
            got = hf_llama.read_leaf(ckpt, cfg, leaf, index)
            assert np.array_equal(got, node[index]), (path, index)


def test_the_load_is_counted_against_host_memory():
    """``init_from_bytes``: the largest parameter's shards, one per device of the host in the
    parameter's dtype plus one 4-byte-per-element copy being cast; ``check_fits`` adds it to
    what a host needs."""
    import jax
    from jax.sharding import PartitionSpec as P

    from orchestrator.shared.errors import DoesNotFit
    from workers.training import memory

    params = {"a": jax.ShapeDtypeStruct((8, 4), np.float32),
              "b": jax.ShapeDtypeStruct((2,), np.float32)}
    got = memory.init_from_bytes(params, {"a": P("fsdp", None), "b": P()},
                                 mesh_shape={"data": 1, "fsdp": 2, "tensor": 1},
                                 devices_per_host=2)
    assert got == 4 * 4 * (2 * 4 + 4)
    est = memory.MemoryEstimate(mesh_shape=(("data", 1), ("fsdp", 1), ("tensor", 1)),
                                devices_per_host=1, device=dict.fromkeys(memory.DEVICE_PARTS, 100),
                                state_bytes=200, copy_bytes=200)
    memory.check_fits(est, device_bytes=None, host_bytes=500, shared=True)  # 400 fits
    with pytest.raises(DoesNotFit) as info:
        memory.check_fits(dataclasses.replace(est, load_bytes=200), device_bytes=None,
                          host_bytes=500, shared=True)
    assert info.value.component == "host" and "task.init_from" in info.value.message


def test_a_bad_directory_exits_2_from_the_driver_before_any_host_starts(tmp_path):
    """``python -m orchestrator.main`` as a user runs it: exit 2, the setting, what is wrong
    and the fix, nothing left running (the task check runs before Ray)."""
    from tests.integration.cli import run_main

    res = run_main([f"run.run_dir={tmp_path / 'run'}", *LLAMA,
                    f"task.init_from={tmp_path / 'nowhere'}"], timeout_s=120, grace_s=5)
    assert res.code == 2, res.stderr[-3000:]
    text = " ".join(res.stderr.split())  # the paragraph is wrapped at 100 columns
    assert "Traceback" not in text
    assert "`task.init_from`" in text and "nowhere is not a directory" in text
    assert "Fix: point task.init_from at a Hugging Face Llama directory" in text
    assert res.leftovers == ()


def test_the_driver_skips_the_directory_when_the_run_dir_holds_a_committed_step(check_here,
                                                                               tmp_path):
    """``check_task`` decides from the run directory: a committed step of this task (another
    start of the same run) passes with the directory gone; none, and it is refused."""
    from orchestrator.driver.task_check import check_task

    ok = check(GOLDEN)
    cfg = load_config(None, [*LLAMA, f"task.init_from={tmp_path / 'gone'}"])
    with pytest.raises(ConfigError) as info:
        check_task(cfg, tmp_path / "run")
    assert info.value.setting == "task.init_from"
    step = tmp_path / "run" / "checkpoints" / "3"
    (step / "meta").mkdir(parents=True)
    (step / "commit_success.txt").write_text("")
    (step / "_CHECKPOINT_METADATA").write_text("{}")
    (step / "meta" / "metadata").write_text(json.dumps(
        {"step": 3, "task": ok.task, "task_fingerprint": ok.fingerprint}))
    assert check_task(cfg, tmp_path / "run").fingerprint == ok.fingerprint


def test_a_sharded_directory_reads_the_same_slices(tmp_path):
    """A checkpoint split over two files by ``model.safetensors.index.json`` gives each
    slice as the single file does."""
    from workers.models import safetensors_io

    single = safetensors_io.SafetensorsFile(GOLDEN / "model.safetensors")
    names = list(single.entries)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for file, part in halves.items():
        specs = {n: (single.entries[n].shape, single.entries[n].dtype) for n in part}
        safetensors_io.write(tmp_path / file, specs, single.read)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {n: f for f, part in halves.items() for n in part}}))
    shutil.copy(GOLDEN / "config.json", tmp_path / "config.json")
    hf = json.loads((GOLDEN / "config.json").read_text())
    cfg = LlamaConfig(**{**hf_llama.config_from_hf(hf), "seq_len": 16})
    one, two = hf_llama.Checkpoint(GOLDEN), hf_llama.Checkpoint(tmp_path)
    assert len(two.files) == 2
    for leaf in hf_llama.leaf_tensors(cfg).values():
        index = tuple(slice(0, 1) for _ in range(len(leaf[0].kernel) + (leaf[0].layer is not
                                                                         None)))
        assert np.array_equal(hf_llama.read_leaf(one, cfg, leaf, index),
                              hf_llama.read_leaf(two, cfg, leaf, index))


def test_a_slice_is_cast_to_the_parameters_dtype_and_the_seed_deleted():
    """``load_params`` in this process: float32 weights become the bfloat16 parameter by
    rounding to nearest even, the seeded array is deleted (one slice asked for one device;
    several devices sharing a slice: ``test_a_new_run_from_a_golden...``)."""
    import jax
    import ml_dtypes

    from workers.training.init_from import load_params

    weights = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4) + 1e-3
    asked = []

    class Source:
        def check(self, params):
            pass

        def read(self, path, index):
            asked.append((path, index))
            return weights[index]

    seeded = {"w": jax.device_put(np.zeros((3, 4), ml_dtypes.bfloat16))}
    old = seeded["w"]
    got = load_params(Source(), seeded)
    assert old.is_deleted()
    assert got["w"].dtype == ml_dtypes.bfloat16
    assert np.array_equal(np.asarray(got["w"]), weights.astype(ml_dtypes.bfloat16))
    assert len(asked) == 1 and asked[0][0] == ("w",)
