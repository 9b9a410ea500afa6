"""The memory estimate: shard arithmetic, per-device and per-host bytes, the fit check."""

from __future__ import annotations

import functools
import math
import pickle

import pytest
from jax.sharding import PartitionSpec as P

from workers.models.llama import LLAMA_RULES, LlamaConfig, LlamaLM, param_count
from workers.training.memory import (
    GIB,
    DoesNotFit,
    abstract_train_state,
    check_fits,
    estimate,
    shard_shape,
    smaller_model_fix,
)


@functools.lru_cache(maxsize=8)
def _state(preset: str, **overrides):
    import optax

    cfg = LlamaConfig.preset(preset, **overrides)
    return cfg, abstract_train_state(LlamaLM(cfg), optax.adamw(1e-4), seq_len=cfg.seq_len)


def _estimate(preset: str, mesh: tuple[int, int, int], per_host: int, *, ram_keep: int = 0,
              ram_max_host_bytes: int | None = None, **overrides):
    cfg, state = _state(preset, **overrides)
    sizes = dict(zip(("data", "fsdp", "tensor"), mesh, strict=True))
    return cfg, estimate(state, mesh_shape=sizes, devices_per_host=per_host, rules=LLAMA_RULES,
                         ram_keep=ram_keep, ram_max_host_bytes=ram_max_host_bytes)


def test_shard_shape_divides_by_the_named_axes():
    """Each dimension is divided by its axes' product, rounded up; missing entries are whole."""
    sizes = {"data": 2, "fsdp": 4, "tensor": 2}
    assert shard_shape((8, 6), P("fsdp", "tensor"), sizes) == (2, 3)
    assert shard_shape((8, 6), P(("data", "fsdp"), None), sizes) == (1, 6)
    assert shard_shape((10, 6, 3), P(None, "fsdp"), sizes) == (10, 2, 3)  # 6/4 rounds up
    assert shard_shape((5,), P(), sizes) == (5,)
    assert shard_shape((5,), None, sizes) == (5,)
    assert shard_shape((), P(), sizes) == ()


def test_shard_shape_refuses_unknown_axes_and_long_specs():
    """An axis the mesh lacks, or more entries than dimensions, is refused with the fix."""
    with pytest.raises(ValueError, match=r"'model'.*pass every mesh axis"):
        shard_shape((8,), P("model"), {"fsdp": 2})
    with pytest.raises(ValueError, match="one entry"):
        shard_shape((8,), P("fsdp", None), {"fsdp": 2})


def test_tiny_estimate_adds_up_by_hand():
    """Unsharded, params are 4 bytes × N, AdamW's moments 2 × that (+ its count), grads = params,
    other = step + rng; the RAM copy is the state over the hosts."""
    cfg, est = _estimate("tiny", (2, 1, 1), 1, ram_keep=2)
    n = param_count(cfg)
    assert est.device["params"] == 4 * n
    assert est.device["opt_state"] == 2 * 4 * n + 4  # mu, nu; int32 count
    assert est.device["grads"] == 4 * n
    assert est.device["other"] == 4 + 8  # int32 step, uint32[2] key data
    assert est.state_bytes == 3 * 4 * n + 4 + 12
    assert est.hosts == 2 and est.copy_bytes == math.ceil(est.state_bytes / 2)
    assert est.ram_tier == est.copy_bytes * (2 * 2 + 1)
    assert est.host["params"] == 4 * n and est.host["ram_tier"] == est.ram_tier


def test_sharding_divides_the_device_share():
    """Over fsdp=2 × tensor=2 every matmul weight is split 4 ways: params per device drop to
    about a quarter (norm scales split only over fsdp)."""
    _, whole = _estimate("tiny", (1, 1, 1), 1)
    _, split = _estimate("tiny", (1, 2, 2), 4)
    assert whole.device["params"] / 4 <= split.device["params"] < whole.device["params"] / 3.9
    assert split.state_bytes == whole.state_bytes
    assert split.host["params"] == 4 * split.device["params"]


def test_estimate_matches_real_sharded_arrays():
    """What one device of a real (1, 2, 2) mesh holds of the initialised train state is exactly
    the estimate's per-device params + opt_state + other (tests.models.sharding_probe)."""
    from tests.models.test_llama import _probe

    held = _probe("--mesh", "1,2,2")["device0_bytes"]
    _, est = _estimate("tiny", (1, 2, 2), 4)
    assert held == est.device["params"] + est.device["opt_state"] + est.device["other"]


def test_8b_fp32_adamw_on_one_host_is_refused():
    """8b with fp32 params and AdamW on one 4-device host needs ~30 GiB per device: refused,
    naming the device, both numbers and the fixes."""
    _, est = _estimate("8b", (1, 4, 1), 4)
    assert est.device_total > 29 * GIB
    with pytest.raises(DoesNotFit) as err:
        check_fits(est, device_bytes=16 * GIB, host_bytes=400 * GIB,
                   smaller=smaller_model_fix("llama", {"preset": "8b"}))
    e = err.value
    assert e.component == "device" and e.need == est.device_total and e.have == 16 * GIB
    assert "16.00 GiB" in str(e) and f"{est.device_total / GIB:.2f} GiB" in str(e)
    for fix in ("mesh.ici.fsdp", "more hosts", "task.preset=1b", "param_dtype=bfloat16",
                "about 8 needed"):
        assert fix in e.fix, e.fix


def test_8b_over_fsdp_64_fits_a_16_gib_device():
    """The same 8b state over fsdp=64 (16 hosts × 4 devices) needs ~1.9 GiB per device: fits
    16 GiB devices, with the RAM tier (keep 2) within 64 GiB hosts."""
    cfg, est = _estimate("8b", (1, 64, 1), 4, ram_keep=2, ram_max_host_bytes=64 * GIB)
    n = param_count(cfg)
    assert est.device["params"] == pytest.approx(4 * n / 64, rel=0.01)
    assert est.device["opt_state"] == pytest.approx(2 * 4 * n / 64, rel=0.01)
    assert est.device_total < 2 * GIB
    check_fits(est, device_bytes=16 * GIB, host_bytes=64 * GIB)


def test_bf16_params_halve_the_state():
    """param_dtype=bfloat16 halves params, Adam moments and grads."""
    _, f32 = _estimate("1b", (1, 8, 1), 4)
    _, bf16 = _estimate("1b", (1, 8, 1), 4, param_dtype="bfloat16")
    assert bf16.device["params"] * 2 == f32.device["params"]
    assert bf16.device["grads"] * 2 == f32.device["grads"]
    assert bf16.device["opt_state"] < 0.51 * f32.device["opt_state"]


def test_ram_tier_over_max_host_bytes_is_refused():
    """Copies × keep × 2 past checkpoint.ram.max_host_bytes (the replicator would switch the
    tier off) is refused, naming the setting and the value that would do."""
    _, est = _estimate("1b", (1, 8, 1), 4, ram_keep=2, ram_max_host_bytes=2 * GIB)
    with pytest.raises(DoesNotFit) as err:
        check_fits(est, device_bytes=16 * GIB, host_bytes=400 * GIB)
    e = err.value
    assert e.component == "ram_tier" and e.need == est.copy_bytes * 4 and e.have == 2 * GIB
    assert f"checkpoint.ram.max_host_bytes={est.copy_bytes * 4}" in e.fix


def test_ram_tier_over_host_memory_is_refused():
    """A RAM tier larger than the host's memory is refused with fewer copies as a fix."""
    _, est = _estimate("1b", (1, 8, 1), 4, ram_keep=3)
    with pytest.raises(DoesNotFit) as err:
        check_fits(est, device_bytes=16 * GIB, host_bytes=8 * GIB)
    assert err.value.component == "host"
    assert "checkpoint.ram.keep" in err.value.fix and "checkpoint.ram.enabled" in err.value.fix


def test_devices_in_host_ram_count_against_the_host():
    """On the CPU emulation (shared) a host's RAM holds its devices' state and the RAM tier:
    each fits alone, both together do not."""
    _, est = _estimate("tiny", (1, 2, 1), 2, ram_keep=2)
    devices = est.device_total * 2
    check_fits(est, device_bytes=est.device_total, host_bytes=est.ram_tier, shared=False)
    with pytest.raises(DoesNotFit) as err:
        check_fits(est, device_bytes=est.device_total, host_bytes=est.ram_tier, shared=True)
    e = err.value
    assert e.component == "host" and e.need == devices + est.ram_tier
    assert "train state of its devices and the RAM tier" in str(e)


def test_unknown_bounds_are_not_checked_and_advice_follows_the_task():
    _, est = _estimate("8b", (1, 4, 1), 4)
    check_fits(est, device_bytes=None, host_bytes=None)
    assert "model.d_model" in smaller_model_fix("lm", {})
    assert "task.preset=tiny" in smaller_model_fix("llama", {"preset": "1b"})
    assert "bfloat16" in smaller_model_fix("my_pkg.tasks:make", {"hidden": 8})


def test_human_is_one_line_with_every_part():
    """human() is one line naming every part, the RAM tier and the mesh."""
    _, est = _estimate("tiny", (1, 2, 2), 2, ram_keep=2)
    line = est.human()
    assert "\n" not in line
    for word in ("params", "opt_state", "grads", "other", "RAM tier", "fsdp=2", "2 host(s)"):
        assert word in line, line


def test_does_not_fit_survives_pickling():
    """The error crosses actor boundaries with its component and numbers."""
    e = pickle.loads(pickle.dumps(DoesNotFit(component="device", need=2, have=1, message="m",
                                             fix="f")))
    assert (e.component, e.need, e.have, e.fix) == ("device", 2, 1, "f")


def test_mesh_that_does_not_split_into_hosts_is_refused():
    """A device count that is not a multiple of devices_per_host names the fix."""
    _, state = _state("tiny")
    with pytest.raises(ValueError, match="devices each host"):
        estimate(state, mesh_shape={"data": 1, "fsdp": 6, "tensor": 1}, devices_per_host=4)
